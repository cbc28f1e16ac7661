"""Times ARL-Tangram's DPArrange: the unit pool operator on 64 candidates over 256 CPU cores
(the paper's DoP 1..32 setting; target within 1 ms) and the GPU chunk operator on 8-GPU nodes;
reports medians over repeats.

Durations follow Amdahl's law with a per-unit overhead, t(k) = t1 (p / k + 1 - p) + c k, so they
are not monotone in k. Run: ``python benchmarks/bench_arrange.py [--repeats N] [--seed S]
[--json PATH]``

`--json PATH` writes one results document (`loom.bench.results`): a record `"case"` per case
(its median milliseconds, the arrangement's total and units used, and for the unit pool whether
it meets the 1 ms target).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
from rich.console import Console
from rich.table import Table

from loom.actions.tangram.arrange import (
    Arrangement,
    dp_arrange,
    dp_arrange_chunks,
    free_blocks,
)
from loom.bench.script import add_json_option, write_json

T = TypeVar("T")

TASKS, CORES, TARGET_S = 64, 256, 1e-3
POWERS = (1, 2, 4, 8, 16, 32)


def timed(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """Median wall time in seconds over repeats, and the last result."""
    times: list[float] = []
    result = fn()  # warm-up (imports, caches)
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def amdahl(rng: np.random.Generator, n: int, units: Sequence[int]) -> list[dict[int, float]]:
    """n tasks: lognormal single-unit time, parallel fraction in [0.5, 1), small per-unit cost."""
    t1 = rng.lognormal(0.0, 1.0, n)
    p = rng.uniform(0.5, 1.0, n)
    c = rng.uniform(0.0, 0.01, n) * t1
    return [{k: float(t1[i] * (p[i] / k + 1.0 - p[i]) + c[i] * k) for k in units} for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=101)
    parser.add_argument("--seed", type=int, default=0)
    add_json_option(parser)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)

    powers = amdahl(rng, TASKS, POWERS)
    dense = amdahl(rng, TASKS, range(1, 33))
    gpu_tasks = amdahl(rng, 8, (1, 2, 4, 8))
    busy = [{0, 5}, set(), {3}, {1, 2, 6}]  # four 8-GPU nodes, some GPUs taken
    free = [size for node in busy for _, size in free_blocks(8, node)]
    cases: list[tuple[str, str, Callable[[], Arrangement | None]]] = [
        ("unit pool, DoP {1,2,4,...,32}", f"{CORES} cores", lambda: dp_arrange(powers, CORES)),
        ("unit pool, DoP 1..32", f"{CORES} cores", lambda: dp_arrange(dense, CORES)),
        ("GPU chunks, idle node", "8 GPUs", lambda: dp_arrange_chunks(gpu_tasks, 8)),
        ("GPU chunks, 4 nodes", f"free {free}", lambda: dp_arrange_chunks(gpu_tasks, 8, free=free)),
    ]
    assert dp_arrange_chunks(gpu_tasks, 8) == dp_arrange(gpu_tasks, 8), "idle node = unit pool"

    table = Table(title=f"DPArrange (median of {args.repeats}, Amdahl durations)")
    for col in ("case", "tasks", "capacity", "median", "total", "units used"):
        table.add_column(col, justify="left" if col in ("case", "capacity") else "right")
    medians: dict[str, float] = {}
    records = []
    for name, capacity, fn in cases:
        median, result = timed(fn, args.repeats)
        medians[name] = median
        n = len(powers) if name.startswith("unit") else len(gpu_tasks)
        records.append(
            {
                "record": "case",
                "case": name,
                "tasks": n,
                "capacity": capacity,
                "repeats": args.repeats,
                "median_ms": median * 1e3,
                "total": result.total if result else None,
                "units_used": sum(result.units) if result else None,
            }
        )
        table.add_row(
            name,
            str(n),
            capacity,
            f"{median * 1e3:.3f} ms",
            f"{result.total:.2f}" if result else "-",
            str(sum(result.units)) if result else "-",
        )
    console = Console(width=140)
    console.print(table)
    for name in ("unit pool, DoP {1,2,4,...,32}", "unit pool, DoP 1..32"):
        verdict = "meets" if medians[name] <= TARGET_S else "misses"
        console.print(f"{name}: median {medians[name] * 1e3:.3f} ms {verdict} the 1 ms target")
        record = next(r for r in records if r["case"] == name)
        record |= {"target_ms": TARGET_S * 1e3, "meets_target": medians[name] <= TARGET_S}
    if out := write_json(args.json, "bench_arrange", records, seed=args.seed):
        console.print(f"wrote {len(records)} records to {out}")


if __name__ == "__main__":
    main()
