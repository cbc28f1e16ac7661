"""CPU seconds as /proc counts them (of a process, of a tree, by class), a run's window of
CPU and wall time and engine counters, round trips and percentiles."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from loom.bench.fleet import StandinEngines
from loom.bench.measure import (
    CPU_CLASSES,
    cpu_by_class,
    cpu_s,
    cpu_spent,
    own_cpu_s,
    percentile,
    round_trip_s,
    rss_mb,
    run_window,
    tree_cpu_s,
)


def _burn(seconds: float) -> None:
    t0 = own_cpu_s()
    while own_cpu_s() - t0 < seconds:
        sum(i * i for i in range(10_000))


def test_a_process_own_cpu() -> None:
    with cpu_spent(os.getpid()) as used:
        _burn(0.2)
    assert used() >= 0.15  # /proc counts in clock ticks
    assert cpu_s(os.getpid()) == pytest.approx(own_cpu_s(), abs=0.05)
    with pytest.raises(ProcessLookupError):
        cpu_s(2**22 + 1)  # above the kernel's largest pid


def test_the_cpu_a_block_spent_is_known_once_it_ends() -> None:
    with cpu_spent(os.getpid()) as used, pytest.raises(AssertionError, match="once the block"):
        used()


def test_a_tree_counts_its_children() -> None:
    """A child that burns half a CPU second and then waits: the tree of this process counts
    it, the process alone does not."""
    code = (
        "import os, sys\n"
        "t = os.times()\n"
        "while sum(os.times()[:2]) - sum(t[:2]) < 0.5: pass\n"
        "print('done', flush=True); sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        assert tree_cpu_s([child.pid]) >= 0.45
        assert tree_cpu_s([os.getpid()]) >= cpu_s(os.getpid()) + 0.45
        assert tree_cpu_s([2**22 + 1]) == 0.0  # gone: nothing
    finally:
        child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()


def test_cpu_by_class_counts_this_process_as_the_agents() -> None:
    before = cpu_s(os.getpid())
    used = cpu_by_class()
    after = cpu_s(os.getpid())
    assert set(used) == set(CPU_CLASSES)
    assert before <= used["agents"] <= after


class _Counting:
    """Engines whose counters move by one each time they are read."""

    def __init__(self) -> None:
        self.reads = 0

    def pids(self) -> list[int]:
        return []

    def counters(self) -> dict[str, float]:
        self.reads += 1
        return {"preemptions": 10.0 * self.reads}


def test_a_run_window() -> None:
    engines = _Counting()
    with run_window(engines) as window:
        assert window == {}
        time.sleep(0.05)
        _burn(0.1)
    assert window["wall_s"] >= 0.05
    assert window["agents_cpu_s"] >= 0.05
    assert window["engines_cpu_s"] == 0.0
    assert window["engine"] == {"preemptions": 10.0}


def test_round_trip_and_memory(standins: StandinEngines) -> None:
    assert 0 < round_trip_s(standins.urls[0], n=5) < 5
    assert rss_mb(os.getpid()) > 10


def test_percentile_by_rank() -> None:
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(xs, 0.0) == 1.0
    assert percentile(xs, 0.5) == 3.0
    assert percentile(xs, 0.99) == 5.0
    assert percentile(xs, 1.0) == 5.0
    with pytest.raises(ValueError, match="nothing"):
        percentile([], 0.5)
