"""What a process group leaves in `/dev/shm` when it dies without cleaning up.

vLLM's engine core and workers talk through POSIX shared memory (`/dev/shm/psm_*`, its
message-queue rings, tens of MiB each) that the engine core unlinks when it shuts down; joblib's
loky, which it imports, leaves named semaphores (`/dev/shm/sem.loky-<pid>-*`). A group killed
by SIGKILL (an operator's `kill -9 -<pgid>`, a crash test, the escalation after a stop's grace)
runs none of that, and the files outlive it, holding memory until the machine restarts.

`ShmLeftovers` notes what the group maps while it runs and, once every member is gone, removes
what no live process maps."""

from __future__ import annotations

import contextlib
import glob
import os
import time
from pathlib import Path

from loom.proc.tether import group_members

__all__ = ["ShmLeftovers", "mapped_shm"]

SHM = Path("/dev/shm")
_DELETED = " (deleted)"


def mapped_shm(pid: int) -> set[Path]:
    """The `/dev/shm` files process `pid` maps (those still linked); empty if it is gone."""
    found: set[Path] = set()
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(f"{SHM}/"):
                    name = fields[5].rstrip("\n")
                    if not name.endswith(_DELETED):
                        found.add(Path(name))
    except OSError:  # gone, or not ours to read
        pass
    return found


def _running(pid: int) -> bool:
    """Whether `pid` is a process that is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _mapped_by_anyone() -> set[Path]:
    found: set[Path] = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            found |= mapped_shm(int(name))
    return found


class ShmLeftovers:
    """The shared memory of process group `pgid`: `note()` while it runs (again whenever it may
    have made more), `sweep()` once it has ended."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.pids: set[int] = set()
        self.files: set[Path] = set()

    def note(self) -> None:
        for pid in group_members(self.pgid):
            self.pids.add(pid)
            self.files |= mapped_shm(pid)

    def sweep(self, wait_s: float = 5.0) -> list[Path]:
        """Remove what the group left: the files it mapped that no live process maps, and the
        loky semaphores named after its processes. Nothing while a member still runs (waiting
        up to `wait_s` for the last to go); the paths removed."""
        deadline = time.monotonic() + wait_s
        while group_members(self.pgid):
            if time.monotonic() >= deadline:
                return []
            time.sleep(0.05)
        candidates = {f for f in self.files if f.exists()}
        for pid in self.pids:
            if not _running(pid):  # (a reused pid's files are not its)
                candidates |= {Path(p) for p in glob.glob(f"{SHM}/sem.loky-{pid}-*")}
        if not candidates:
            return []
        removed = []
        for path in sorted(candidates - _mapped_by_anyone()):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
        return removed
