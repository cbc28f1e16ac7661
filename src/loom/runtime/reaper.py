"""A server's reaper: a small process, started with the server, that ends what the server
started once the server is gone, however it went (SIGKILL included). The server tells it, over
a pipe only the server writes, each process group it starts and ends (`+PGID`, `-PGID`); when
the pipe closes (the kernel closes it when the server dies) the reaper kills the groups still
listed, removes the server's cgroups (killing whatever runs in them, processes that left their
group included) and deletes the directories it was given, then exits.

NOTE: why a reaper and not PR_SET_PDEATHSIG. Actions are spawned without a `preexec_fn` (so
that Python can vfork the server: see `actions/process.py`), the death signal reaches only the
direct child, not what it starts, and it fires when the spawning *thread* ends. One process per
server that holds the list costs a few MB, and nothing per action but a line on a pipe. Under
bubblewrap an action also dies with the server by itself (`--die-with-parent`, and its PID
namespace ends with its first process); the reaper covers `--sandbox none`, and cgroups.

Usage (by `Reaper.start`): `python -m loom.runtime.reaper [--cgroups JSON] [--remove DIR]...`
with the pipe as stdin."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["Reaper"]

log = logging.getLogger(__name__)


class Reaper:
    """The server's side: `start(...)` the reaper, `track(pgid)` each process group started,
    `forget(pgid)` it before it is reaped, `close()` at shutdown. A reaper that died is
    reported once and then ignored (the server goes on without one)."""

    def __init__(self, proc: subprocess.Popen[bytes], pipe: int) -> None:
        self.proc = proc
        self._pipe = pipe
        self._broken = False

    @classmethod
    def start(cls, *, cgroups: dict[str, Any] | None = None, remove: Sequence[Path] = ()) -> Reaper:
        """`cgroups`: a `Cgroups.spec()` whose instance is removed; `remove`: directories
        deleted once the server is gone."""
        argv = [sys.executable, "-m", __name__]
        if cgroups is not None:
            argv += ["--cgroups", json.dumps(cgroups)]
        for path in remove:
            argv += ["--remove", str(path)]
        read, write = os.pipe()  # non-inheritable; the reaper gets `read` as stdin
        try:
            # its own session: a Ctrl-C or a signal to the server's group leaves it running
            proc = subprocess.Popen(argv, stdin=read, start_new_session=True)
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        return cls(proc, write)

    def _send(self, line: str) -> None:
        if self._pipe < 0 or self._broken:
            return
        try:
            os.write(self._pipe, line.encode())
        except OSError as exc:  # it died: the server goes on, its leftovers unguarded
            self._broken = True
            log.warning(
                "the reaper (pid %d) is gone (%s); a kill of this server will leave "
                "its actions running",
                self.proc.pid,
                exc,
            )

    def track(self, pgid: int) -> None:
        self._send(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}\n")

    def close(self, timeout_s: float = 30.0) -> None:
        """Close the pipe (the reaper removes what is left, as after a kill) and wait for it."""
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("the reaper (pid %d) did not finish in %.0f s", self.proc.pid, timeout_s)
            self.proc.kill()
            self.proc.wait()


def _listen(stream: Any) -> set[int]:
    """The process groups still listed when the pipe closes."""
    groups: set[int] = set()
    for raw in stream:
        line = raw.strip()
        with contextlib.suppress(ValueError):
            if line.startswith(b"+"):
                groups.add(int(line[1:]))
            elif line.startswith(b"-"):
                groups.discard(int(line[1:]))
    return groups


def _reap(groups: set[int], cgroups: dict[str, Any] | None, remove: list[Path]) -> list[str]:
    done = []
    killed = 0
    for pgid in sorted(groups):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
            killed += 1
    if killed:
        done.append(f"killed {killed} process groups")
    if cgroups is not None:
        from loom.runtime.actions.cgroups import remove_root

        bases = {ctl: Path(p) for ctl, p in cgroups["bases"].items()}
        ctl = "unified" if cgroups["version"] == 2 else "pids"
        if (bases[ctl] / cgroups["root"]).exists():
            remove_root(cgroups["version"], bases, cgroups["root"])
            done.append(f"removed cgroups {cgroups['root']}")
    for path in remove:
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {path}")
    return done


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loom.runtime.reaper", description=__doc__)
    parser.add_argument("--cgroups", type=json.loads, default=None)
    parser.add_argument("--remove", type=Path, action="append", default=[])
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # it ends when the pipe does
    server = os.getppid()
    done = _reap(_listen(sys.stdin.buffer), args.cgroups, args.remove)
    if done:  # after a clean shutdown nothing is left to do, and nothing is said
        print(f"loom reaper: server {server} is gone: {'; '.join(done)}", file=sys.stderr)


if __name__ == "__main__":
    main()
