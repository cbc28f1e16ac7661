"""Processes as /proc shows them: a process's descendants, and whether a pid is gone."""

from __future__ import annotations

import time
from pathlib import Path


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a live process, None if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def gone(pid: int) -> bool:
    """No such process, or only its exit status is left (a zombie nobody reaped yet)."""
    st = _stat(pid)
    return st is None or st[0] in ("Z", "X")


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`."""
    parent_of = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = _stat(int(d.name))
            if st is not None and st[0] not in ("Z", "X"):
                parent_of[int(d.name)] = st[1]
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parent_of.items() if pp in frontier} - out
        out |= frontier
    return out


def wait_gone(pids: set[int], timeout_s: float = 60.0) -> set[int]:
    """Wait (polling) until every pid is gone; the ones left at the deadline."""
    deadline = time.monotonic() + timeout_s
    left = {p for p in pids if not gone(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = {p for p in left if not gone(p)}
    return left
