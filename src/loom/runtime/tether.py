"""A child process group that cannot outlive its parent: `Tethered(cmd)` starts `cmd` under a
small tether process that leads the group, and the tether ends the whole group once its
lifeline (a pipe whose only writer is the parent) closes — which the kernel does when the
parent dies, by any signal, SIGKILL included.

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
    """`subprocess.Popen(cmd, ...)` but tethered: the command runs in a new session led by a
    tether (so `pid` is the process group's id: `os.killpg(pid, ...)` reaches the command and
    everything it started), and the group is ended (SIGTERM, SIGKILL after `grace_s`) when
    this object is released or this process dies. The tether exits with the command's exit
    status (dying by the same signal when the command did), after ending what it left.

    The tether owns stdin (the lifeline); the command's stdin is /dev/null."""

    def __init__(self, cmd: Sequence[str], *, grace_s: float = GRACE_S, **kwargs: Any) -> None:
        for owned in ("stdin", "start_new_session", "process_group", "preexec_fn"):
            if owned in kwargs:
                raise TypeError(f"Tethered sets {owned} itself")
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        read, self._lifeline = os.pipe()  # both ends non-inheritable; stdin is dup'ed
        argv = [sys.executable, "-m", __name__, "--grace-s", str(grace_s), "--", *cmd]
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


def _end_group(grace_s: float, child: subprocess.Popen[bytes]) -> None:
    """SIGTERM every other member of this group, SIGKILL what is left after `grace_s`."""
    me, group = os.getpid(), os.getpgrp()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in group_members(group, exclude=me):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while True:
            child.poll()  # reap it, else it stays a member (a zombie)
            if not group_members(group, exclude=me) or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)


def _exit_as(code: int) -> NoReturn:
    """Exit with the command's status: its code, or death by its signal."""
    sys.stdout.flush()
    if code < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(prog="python -m loom.runtime.tether", description=__doc__)
    parser.add_argument("--grace-s", type=float, default=GRACE_S)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        parser.error("no command given")
    pending: list[int] = []  # signals that came before the command started
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: object) -> None:  # `kill <pid>` stops the command
        if child is None:
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)  # in this group
    except OSError as exc:
        print(f"loom tether: cannot run {cmd[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        os._exit(127)
    for signum in pending:
        forward(signum, None)
    exited = os.pidfd_open(child.pid)
    while True:
        ready, _, _ = select.select([0, exited], [], [])
        if exited in ready:
            code = child.wait()
            _end_group(args.grace_s, child)  # what it left behind
            _exit_as(code)
        if 0 in ready and not os.read(0, 4096):
            print(
                f"loom tether: the parent of process group {os.getpgrp()} is gone; ending it",
                file=sys.stderr,
                flush=True,
            )
            _end_group(args.grace_s, child)
            _exit_as(child.wait())


if __name__ == "__main__":
    main()
