"""A process group killed by SIGKILL leaves its POSIX shared memory in /dev/shm (its resource
tracker dies with it); `ShmLeftovers` removes it once the group is gone, and only then, and
never a file a live process still maps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

from loom.proc.shm import ShmLeftovers, mapped_shm
from loom.proc.tether import Tethered, group_members

# a process that makes a segment as vLLM's engine core does (Python's SharedMemory, tracked by
# a resource tracker it starts in its group) and a loky-named semaphore file, then waits
MAKER = textwrap.dedent(
    """
    import os, time
    from multiprocessing import resource_tracker, shared_memory
    seg = shared_memory.SharedMemory(create=True, size=1 << 20)
    seg.buf[:4] = b"loom"
    sem = f"/dev/shm/sem.loky-{os.getpid()}-test"
    open(sem, "wb").close()
    print(seg.name, sem, flush=True)
    time.sleep(600)
    """
)


def _start() -> tuple[Tethered, Path, Path]:
    proc = Tethered([sys.executable, "-c", MAKER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    name, sem = proc.stdout.readline().split()
    proc.stdout.close()
    return proc, Path("/dev/shm") / name, Path(sem)


def test_what_a_killed_group_left_is_removed_once_it_is_gone() -> None:
    proc, seg, sem = _start()
    try:
        leftovers = ShmLeftovers(proc.pid)
        leftovers.note()
        assert seg in leftovers.files and seg in mapped_shm(proc.pid)
        assert leftovers.sweep(wait_s=0.2) == []  # it runs: nothing is touched
        assert seg.exists() and sem.exists()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(0.5)
        assert seg.exists() and sem.exists()  # nothing of the group cleaned up
        assert sorted(leftovers.sweep()) == sorted([seg, sem])
        assert not seg.exists() and not sem.exists()
        assert not group_members(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for path in (seg, sem):
            path.unlink(missing_ok=True)


def test_a_segment_another_process_still_maps_is_kept() -> None:
    proc, seg, sem = _start()
    try:
        leftovers = ShmLeftovers(proc.pid)
        leftovers.note()
        mine = shared_memory.SharedMemory(name=seg.name)  # this process maps it too
        # (Python 3.11 registers an attached segment with this process's tracker, which would
        # unlink it at exit: it is not this process's to remove)
        resource_tracker.unregister(mine._name, "shared_memory")  # type: ignore[attr-defined]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            assert leftovers.sweep() == [sem]
            assert seg.exists() and bytes(mine.buf[:4]) == b"loom"
        finally:
            mine.close()
        assert leftovers.sweep() == [seg]  # (no one maps it now)
    finally:
        proc.wait()
        for path in (seg, sem):
            path.unlink(missing_ok=True)
