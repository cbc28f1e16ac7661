"""A child process group that cannot outlive its parent: `Tethered(cmd)` runs `cmd` as the
leader of a new process group, watched by a small tether process in that group, and the
tether ends the whole group once its lifeline (a pipe whose only writer is the parent) closes
— which the kernel does when the parent dies, by any signal, SIGKILL included — or once the
command exits (ending what it left behind).

The tether forks itself off before the command starts and the first process then `exec`s the
command, so the parent's child is the command itself (its pid, its exit status) and the tether
is the command's child: a parent's killer that also kills the parent's direct children (Ray
does, when it kills an actor's worker) does not reach the tether.

NOTE: why a pipe and not PR_SET_PDEATHSIG. The kernel sends the death signal when the *thread*
that forked the child exits, not the process (engines are started from worker threads: the
engine pool's, a Ray actor's), and only to that one child, while an engine is a tree (vLLM's
API server, its engine core and workers, a resource tracker). A pipe's write end closes only
when the last process holding it is gone, and one process group holds the whole tree: the
tether waits for that end of file and signals the group. It costs one small Python process
per child. A process that leaves the group (`setsid`) escapes it; vLLM's do not."""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["Tethered", "group_members"]

GRACE_S = 5.0  # how long the group has after SIGTERM before SIGKILL
_POLL_S = 0.05


class Tethered(subprocess.Popen[Any]):
    """`subprocess.Popen(cmd, ...)` but tethered: the command leads a new session (so
    `os.killpg(pid, ...)` reaches it and everything it started, the tether included), and
    the group is ended (SIGTERM, SIGKILL after `grace_s`) when this object is released or
    this process dies, or after the command exits. The tether owns stdin (the lifeline); the
    command's stdin is /dev/null."""

    def __init__(self, cmd: Sequence[str], *, grace_s: float = GRACE_S, **kwargs: Any) -> None:
        for owned in ("stdin", "start_new_session", "process_group", "preexec_fn"):
            if owned in kwargs:
                raise TypeError(f"Tethered sets {owned} itself")
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        if not cmd:
            raise ValueError("no command given")
        read, self._lifeline = os.pipe()  # both ends non-inheritable; stdin is dup'ed
        # NOTE: run by its file, isolated (-I) and without site (-S): it needs only the
        # standard library, so it starts fast and whatever `env` the command is given
        argv = [sys.executable, "-I", "-S", __file__, "--grace-s", str(grace_s), "--", *cmd]
        try:
            super().__init__(argv, stdin=read, start_new_session=True, **kwargs)
        except BaseException:
            os.close(self._lifeline)
            self._lifeline = -1
            raise
        finally:
            os.close(read)

    def release(self) -> None:
        """Close the lifeline: the tether ends the group as if this process had died."""
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self.release()  # nothing is left to end
        return code

    def __del__(self) -> None:
        with contextlib.suppress(AttributeError, OSError):
            self.release()
        super().__del__()


def group_members(pgid: int, *, exclude: int | None = None) -> list[int]:
    """Live processes (zombies excluded) of process group `pgid`, but `exclude`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == exclude:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            found.append(int(name))
    return found


def _end_group(grace_s: float) -> None:
    """SIGTERM every other member of this group, SIGKILL what is left after `grace_s`."""
    me, group = os.getpid(), os.getpgrp()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in group_members(group, exclude=me):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while group_members(group, exclude=me) and time.monotonic() < deadline:
            time.sleep(_POLL_S)


def _watch(command: int, grace_s: float) -> NoReturn:
    """The tether: wait until the command exits (`command`, a pidfd) or the lifeline (stdin)
    closes, end the group, exit."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a signal to the group is the command's to handle
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # do not hold the parent's pipe open; stderr stays for the note
        os.close(devnull)
    while True:
        ready, _, _ = select.select([0, command], [], [])
        if command in ready:
            break
        if not os.read(0, 4096):
            # NOTE: stderr may be a pipe to the parent that just died, or one nobody reads
            # that is full: the note must neither end nor block the tether before the group
            # (non-blocking for the group too, which shares the pipe: it is ending anyway)
            with contextlib.suppress(OSError, ValueError):
                os.set_blocking(2, False)
                print(
                    f"loom tether: the parent of process group {os.getpgrp()} is gone; ending it",
                    file=sys.stderr,
                    flush=True,
                )
            break
    _end_group(grace_s)
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(prog="python -m loom.proc.tether", description=__doc__)
    parser.add_argument("--grace-s", type=float, default=GRACE_S)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        parser.error("no command given")
    me = os.pidfd_open(os.getpid())  # close-on-exec: the tether keeps it, the command not
    if os.fork() == 0:
        _watch(me, args.grace_s)
    os.close(me)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the lifeline is the tether's
    os.close(devnull)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"loom tether: cannot run {cmd[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        os._exit(127)


if __name__ == "__main__":
    main()
