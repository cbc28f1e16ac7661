"""Times Heddle placement (exact presorted DP, the Formula 3 reference) and the annealing
resource manager on lognormal trajectory lengths; reports medians over repeats.

Run: ``python benchmarks/bench_placement.py [--repeats N] [--seed S] [--json PATH]``

`--json PATH` writes one results document (`loom.bench.results`): a record `"case"` per timed
solver (its median milliseconds and makespan; the reference's extrapolation to 6,400 lengths;
the annealed degrees) and `"baseline"` per fixed degree (its makespan).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from rich.console import Console
from rich.table import Table

from loom.bench.script import add_json_option, write_json
from loom.rollout.heddle.placement import WorkerCost, presorted_dp, presorted_dp_reference
from loom.rollout.heddle.resource_manager import anneal_allocation, homogeneous_allocation

T = TypeVar("T")

N_FAST, N_REF, WORKERS, GPUS = 6400, 800, 16, 64


def interference(k: int) -> float:
    """Homogeneous interference curve F(k) = 1 + 0.01 k."""
    return 1.0 + 0.01 * k


def worker_cost(degree: int) -> WorkerCost:
    """Degree d: per-token time d^-0.4 (sublinear tensor-parallel speed-up) and interference
    1 + 0.02 k / d^0.2 (more memory per worker softens batching contention)."""
    return WorkerCost(degree**-0.4, lambda k: 1.0 + 0.02 * k / degree**0.2)


def timed(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """Median wall time in seconds over repeats, and the last result."""
    times: list[float] = []
    result = fn()  # warm-up (imports, caches)
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _case(
    case: str, n: int, median_s: float, makespan: float | None, **more: Any
) -> dict[str, Any]:
    """A timed solver's record: its median in milliseconds and the makespan it found."""
    return {
        "record": "case",
        "case": case,
        "n": n,
        **more,
        "median_ms": median_s * 1e3,
        "makespan": makespan,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    add_json_option(parser)
    args = parser.parse_args()
    lengths = np.random.default_rng(args.seed).lognormal(8.0, 1.0, N_FAST)
    small = lengths[:N_REF]

    t_fast, fast = timed(lambda: presorted_dp(lengths, WORKERS, interference), args.repeats)
    t_ref, ref = timed(
        lambda: presorted_dp_reference(small, WORKERS, interference), max(1, args.repeats // 3)
    )
    t_small, small_fast = timed(lambda: presorted_dp(small, WORKERS, interference), args.repeats)
    assert ref.makespan == small_fast.makespan, "exact solvers disagree"
    t_anneal, alloc = timed(lambda: anneal_allocation(lengths, GPUS, worker_cost), args.repeats)
    fix = {d: homogeneous_allocation(lengths, GPUS, worker_cost, d).makespan for d in (1, 2, 4, 8)}

    table = Table(title=f"Heddle placement (median of {args.repeats}, lognormal(8, 1) lengths)")
    for col in ("case", "n", "workers / GPUs", "median", "makespan"):
        table.add_column(col, justify="right" if col != "case" else "left")
    table.add_row(
        "presorted_dp (exact)",
        str(N_FAST),
        str(WORKERS),
        f"{t_fast * 1e3:.2f} ms",
        f"{fast.makespan:.1f}",
    )
    table.add_row(
        "presorted_dp (exact)",
        str(N_REF),
        str(WORKERS),
        f"{t_small * 1e3:.2f} ms",
        f"{small_fast.makespan:.1f}",
    )
    table.add_row(
        "presorted_dp_reference (Formula 3)",
        str(N_REF),
        str(WORKERS),
        f"{t_ref * 1e3:.1f} ms",
        f"{ref.makespan:.1f}",
    )
    table.add_row(
        "  reference extrapolated (x n²)",
        str(N_FAST),
        str(WORKERS),
        f"{t_ref * (N_FAST / N_REF) ** 2 * 1e3:.0f} ms",
        "",
    )
    table.add_row(
        "anneal_allocation",
        str(N_FAST),
        f"{GPUS} GPUs",
        f"{t_anneal:.3f} s",
        f"{alloc.makespan:.1f}",
    )
    table.add_row(
        "  Fix-1 / 2 / 4 / 8 baselines",
        str(N_FAST),
        f"{GPUS} GPUs",
        "",
        " / ".join(f"{fix[d]:.0f}" for d in (1, 2, 4, 8)),
    )
    console = Console(width=120)
    console.print(table)
    console.print(
        f"annealed degrees: {alloc.degrees} "
        f"({alloc.iterations} steps, {alloc.evaluations} placements)"
    )
    reps, few = {"repeats": args.repeats}, {"repeats": max(1, args.repeats // 3)}
    records = [
        _case("presorted_dp", N_FAST, t_fast, fast.makespan, workers=WORKERS, **reps),
        _case("presorted_dp", N_REF, t_small, small_fast.makespan, workers=WORKERS, **reps),
        _case("presorted_dp_reference", N_REF, t_ref, ref.makespan, workers=WORKERS, **few),
        _case(
            "presorted_dp_reference_extrapolated",
            N_FAST,
            t_ref * (N_FAST / N_REF) ** 2,
            None,
            workers=WORKERS,
        ),
        _case(
            "anneal_allocation",
            N_FAST,
            t_anneal,
            alloc.makespan,
            gpus=GPUS,
            **reps,
            degrees=list(alloc.degrees),
            steps=alloc.iterations,
            placements=alloc.evaluations,
        ),
    ]
    fixed = {"record": "baseline", "n": N_FAST, "gpus": GPUS}
    records += [{**fixed, "case": f"fix_{d}", "degree": d, "makespan": fix[d]} for d in fix]
    if out := write_json(args.json, "bench_placement", records, seed=args.seed):
        console.print(f"wrote {len(records)} records to {out}")


if __name__ == "__main__":
    main()
