"""Where a benchmark's CPU and time go: CPU seconds of processes as /proc counts them, the CPU
and wall seconds of a block of work, and the round trip of an HTTP request on loopback."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

__all__ = [
    "CPU_CLASSES",
    "Engines",
    "cpu_by_class",
    "cpu_s",
    "cpu_spent",
    "own_cpu_s",
    "percentile",
    "round_trip_s",
    "rss_mb",
    "run_window",
    "tree_cpu_s",
]

_TICK = os.sysconf("SC_CLK_TCK")

# Classes of process on the machine, by key (`cpu_<key>_s` in records): what each is
CPU_CLASSES = {
    "agents": "agents (and Loom's router with --in-process)",
    "vllm_workers": "vLLM model workers",
    "vllm_engine_cores": "vLLM engine cores (scheduler)",
    "vllm_api_servers": "vLLM API servers",
    "other": "other",
}


class Engines(Protocol):
    """What a run window reads of the engines (a `loom.bench.fleet.Fleet`)."""

    def pids(self) -> list[int]: ...

    def counters(self) -> dict[str, float]: ...


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses


def _ticks(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def cpu_s(pid: int) -> float:
    """User + system CPU seconds process `pid` has used (all its threads, not its children).
    ProcessLookupError if it is gone."""
    fields = _stat(pid)
    if fields is None:
        raise ProcessLookupError(f"no process {pid}")
    return _ticks(fields)


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            out.setdefault(int(fields[1]), []).append(int(entry))
    return out


def tree_cpu_s(pids: Iterable[int]) -> float:
    """CPU seconds of processes `pids` and everything below them, so far; a process gone
    counts nothing."""
    children = _children()
    total = 0.0
    seen: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        if (fields := _stat(pid)) is not None:
            total += _ticks(fields)
            todo += children.get(pid, [])
    return total


def own_cpu_s() -> float:
    """CPU seconds of this process so far."""
    t = os.times()
    return t.user + t.system


def _classify(pid: int, name: str, cmdline: str, me: int) -> str:
    if pid == me:
        return "agents"
    if name.startswith("VLLM::Worker"):
        return "vllm_workers"
    if name.startswith("VLLM::EngineCor"):  # the kernel keeps 15 characters of a name
        return "vllm_engine_cores"
    if "vllm.entrypoints" in cmdline:
        return "vllm_api_servers"
    return "other"


def cpu_by_class() -> dict[str, float]:
    """CPU seconds used so far by each class of process on this machine (`CPU_CLASSES`),
    this one's ("agents") included."""
    me = os.getpid()
    used = dict.fromkeys(CPU_CLASSES, 0.0)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or (fields := _stat(int(entry))) is None:
            continue
        pid = int(entry)
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):
            continue
        used[_classify(pid, name, cmdline, me)] += _ticks(fields)
    return used


@contextlib.contextmanager
def cpu_spent(pid: int) -> Iterator[Callable[[], float]]:
    """CPU seconds process `pid` used inside the block; the function it yields answers once
    the block has ended."""
    t0 = cpu_s(pid)
    spent: list[float] = []

    def read() -> float:
        assert spent, "the CPU a block spent is known once the block has ended"
        return spent[0]

    yield read
    spent.append(cpu_s(pid) - t0)


@contextlib.contextmanager
def run_window(engines: Engines) -> Iterator[dict[str, Any]]:
    """The block's wall seconds (`wall_s`), the CPU seconds the engines' processes
    (`engines_cpu_s`) and this process, the agents (`agents_cpu_s`), used in it, and how far
    the engines' counters moved (`engine`); filled in when the block ends."""
    out: dict[str, Any] = {}
    pids = engines.pids()
    counters0 = engines.counters()
    engines0, own0, t0 = tree_cpu_s(pids), own_cpu_s(), time.perf_counter()
    yield out
    out["wall_s"] = time.perf_counter() - t0
    out["engines_cpu_s"] = tree_cpu_s(pids) - engines0
    out["agents_cpu_s"] = own_cpu_s() - own0
    counters = engines.counters()
    out["engine"] = {k: v - counters0.get(k, 0.0) for k, v in counters.items()}


def round_trip_s(url: str, n: int = 50) -> float:
    """Median wall seconds of an HTTP round trip to `url` (a GET of /health)."""
    times = []
    with httpx.Client(base_url=url, timeout=30) as http:
        for _ in range(n):
            t0 = time.perf_counter()
            http.get("/health").raise_for_status()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def percentile(xs: Sequence[float], q: float) -> float:
    """The `q` quantile of `xs` (0 <= q <= 1) by rank, no interpolation."""
    if not xs:
        raise ValueError("the percentile of nothing")
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid`, MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")
