"""Decision latency of PlexRL's policies (targets, medians): placing a job over 256 nodes with
a 28,800-slot horizon and 500 resident jobs ≤ 50 ms; one range-min query ≤ 20 µs; HRRS over
64 queued operations ≤ 1 ms.

    python benchmarks/bench_plexrl_policies.py [--repeats 50] [--residents 500] [--json PATH]

The cluster: 256 one-node groups; 500 jobs of Table 2's shapes (their training operations as
segments of a 285–590 s cycle, jittered ±10%; `--residents`) offered to the placement itself,
which commits those that fit (about 480); then each timed placement tries one more job and
gives its node back.

`--json PATH` writes one results document (`loom.bench.results`): a record `"range_min"`,
`"hrrs"` and `"placement"` each, with its p50, p99 and target.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from loom.bench.script import add_json_option, write_json
from loom.cluster.plexrl import (
    OP_POLICIES,
    Footprint,
    Op,
    PlacementConfig,
    PlexPlacement,
    Timeline,
)
from loom.core.rng import stream

# Table 2: cycle, compute_log_prob, update_actor, sync_weight (s) of the 7B, 30B and 235B jobs
SHAPES = ((289, 10, 38, 10), (285, 20, 56, 8), (590, 20, 82, 9))


def _job(rng, k: int) -> Footprint:  # type: ignore[no-untyped-def]
    cycle, logp, update, sync = SHAPES[k % len(SHAPES)]
    period = int(cycle * rng.uniform(0.9, 1.1))
    return Footprint(((0, logp), (logp, update), (logp + update, sync)), period=period, nodes=1)


def _cluster(residents: int) -> tuple[PlexPlacement, int]:
    rng = stream(1, "bench-plexrl")
    tl = Timeline(nodes=256)
    groups = tuple((g,) for g in range(256))
    pl = PlexPlacement(tl, PlacementConfig(groups=groups, duty_bound=1.0))
    placed = 0
    for k in range(residents):
        if pl.place(f"r{k}", _job(rng, k)) is not None:
            placed += 1
    return pl, placed


def _median_ms(samples: list[float]) -> tuple[float, float]:
    samples.sort()
    return statistics.median(samples), samples[int(0.99 * (len(samples) - 1))]


def bench_placement(repeats: int, residents: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    pl, placed = _cluster(residents)
    cluster_s = time.perf_counter() - t0
    print(f"cluster: {placed} of {residents} jobs placed in {cluster_s:.1f} s")
    rng = stream(2, "bench-plexrl-new")
    times, pruned, fits = [], [], 0
    for k in range(repeats):
        fp = _job(rng, k)
        t = time.perf_counter()
        got = pl.place(f"new{k}", fp)
        times.append((time.perf_counter() - t) * 1e3)
        if got is not None:
            fits += 1
            pruned.append(got.pruned_fraction)
            pl.release(f"new{k}")
    p50, p99 = _median_ms(times)
    print(
        f"placement (256 nodes, 28,800 slots, {placed} residents): p50 {p50:.1f} ms, "
        f"p99 {p99:.1f} ms (target p50 <= 50 ms); placed {fits}/{repeats}"
        + (f", pruned {statistics.mean(pruned):.0%} of the shifts" if pruned else "")
    )
    return {
        "record": "placement",
        "nodes": 256,
        "slots": 28_800,
        "offered": residents,
        "residents": placed,
        "cluster_s": cluster_s,
        "repeats": repeats,
        "p50_ms": p50,
        "p99_ms": p99,
        "target_p50_ms": 50.0,
        "placed": fits,
        "pruned_share": statistics.mean(pruned) if pruned else None,
    }


def bench_range_min(repeats: int, residents: int) -> dict[str, Any]:
    pl, _ = _cluster(residents)
    tl = pl.timeline
    rng = stream(3, "bench-plexrl-rmq")
    spans = [(int(rng.integers(0, 28_800)), int(rng.integers(1, 3_600))) for _ in range(repeats)]
    times = []
    for s, d in spans:
        t = time.perf_counter_ns()
        tl.min_free(s, s + d)
        times.append((time.perf_counter_ns() - t) / 1e3)
    p50, p99 = _median_ms(times)
    print(f"range-min query: p50 {p50:.1f} µs, p99 {p99:.1f} µs (target p50 <= 20 µs)")
    return {
        "record": "range_min",
        "offered": residents,
        "repeats": repeats,
        "p50_us": p50,
        "p99_us": p99,
        "target_p50_us": 20.0,
    }


def bench_hrrs(repeats: int) -> dict[str, Any]:
    rng = stream(4, "bench-plexrl-hrrs")
    policy = OP_POLICIES.get("hrrs")()
    times = []
    for _ in range(repeats):
        ops = [
            Op(
                i,
                f"j{int(rng.integers(0, 8))}",
                float(rng.uniform(0, 60)),
                float(rng.uniform(1, 80)),
            )
            for i in range(64)
        ]
        seq: dict[str, int] = {}
        ops = [
            Op(o.op_id, o.job, o.arrival_s, o.exec_s, _next(seq, o.job))
            for o in sorted(ops, key=lambda o: o.arrival_s)
        ]
        t = time.perf_counter()
        policy.plan(ops, now=60.0, resident="j0", busy_until=60.0, setup=lambda j, r: 19.0)
        times.append((time.perf_counter() - t) * 1e3)
    p50, p99 = _median_ms(times)
    print(
        f"HRRS plan over 64 queued operations: p50 {p50:.2f} ms, p99 {p99:.2f} ms "
        "(target p50 <= 1 ms)"
    )
    return {
        "record": "hrrs",
        "queued_ops": 64,
        "repeats": repeats,
        "p50_ms": p50,
        "p99_ms": p99,
        "target_p50_ms": 1.0,
    }


def _next(seq: dict[str, int], job: str) -> int:
    n = seq.get(job, 0)
    seq[job] = n + 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--residents", type=int, default=500, help="jobs offered to the cluster")
    add_json_option(ap)
    args = ap.parse_args()
    records = [
        bench_range_min(max(1000, args.repeats * 20), args.residents),
        bench_hrrs(max(100, args.repeats * 4)),
        bench_placement(args.repeats, args.residents),
    ]
    # the draws' seeds are fixed (1 to 4, one stream each)
    if out := write_json(args.json, "bench_plexrl_policies", records, seed=1):
        print(f"wrote {len(records)} records to {out}")


if __name__ == "__main__":
    main()
