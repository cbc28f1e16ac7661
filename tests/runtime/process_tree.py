"""Process trees as /proc shows them, for tests that kill a parent and look for what it left.
A process is known by its pid and start time, so that a reused pid is not taken for it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int  # clock ticks since boot

    @property
    def alive(self) -> bool:
        """Not exited (a zombie awaiting its reaper counts as exited)."""
        fields = _stat(self.pid)
        return fields is not None and fields[0] not in ("Z", "X") and int(fields[19]) == self.start

    @property
    def command(self) -> str:
        try:
            raw = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return "?"
        return raw.replace(b"\0", b" ").decode(errors="replace").strip()

    def kill(self) -> None:
        """SIGKILL it if it is still this process (a test's cleanup of what it found)."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def descendants(pid: int) -> list[Proc]:
    """Every live process below `pid` (children, theirs, ...), by parent pid."""
    children: dict[int, list[Proc]] = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and fields[0] not in ("Z", "X"):
            proc = Proc(int(entry.name), int(fields[19]))
            children.setdefault(int(fields[1]), []).append(proc)
    found: list[Proc] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


def wait_descendants(pid: int, count: int, timeout_s: float = 30.0) -> list[Proc]:
    """Until `pid` has at least `count` live descendants; them."""
    deadline = time.monotonic() + timeout_s
    while len(found := descendants(pid)) < count:
        assert time.monotonic() < deadline, f"{pid} has {len(found)} descendants, not {count}"
        time.sleep(0.05)
    return found


def wait_gone(procs: list[Proc], timeout_s: float = 30.0) -> dict[int, str]:
    """Until none of `procs` is alive; those alive at the deadline (pid: command line)."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in procs if p.alive]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {p.pid: p.command for p in left}


@contextlib.contextmanager
def python_parent(code: str) -> Iterator[tuple[subprocess.Popen[str], list[Proc]]]:
    """A Python process running `code` (its stdout a pipe, as text), and a list for the
    processes a test finds below it; on leaving, the parent and those are killed, so that a
    failed test leaves nothing running."""
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    found: list[Proc] = []
    try:
        yield parent, found
    finally:
        parent.kill()
        parent.wait()
        for proc in found:
            proc.kill()
        if parent.stdout is not None:
            parent.stdout.close()


def sigkill_parent(parent: subprocess.Popen[str], tree: list[Proc]) -> dict[int, str]:
    """SIGKILL `parent`; what of `tree` is still alive after a generous wait."""
    parent.kill()
    parent.wait()
    return wait_gone(tree)
