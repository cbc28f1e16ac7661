"""Decision latency of Tangram's elastic scheduler: 64 queued scalable candidates over one
256-core node (target: within 1 ms), and the same with a deep queue behind them; then
`tangram_lookahead` with a history of 128 recent starts, whose arrivals it expects again.

    python benchmarks/bench_tangram_scheduler.py [--repeats 30] [--json PATH]

`--json PATH` writes one results document (`loom.bench.results`): a record `"decision"` per
policy and queue, with the median milliseconds of the decision and of the whole pass.
"""

from __future__ import annotations

import argparse
import statistics
import time

from loom.actions.managers.cpu import CpuManager, CpuNode
from loom.actions.tangram.scheduler import ElasticScheduler, TangramConfig
from loom.bench.script import add_json_option, write_json
from loom.core.actions import ActionKind, ActionSpec
from loom.core.resources import RangeSet
from loom.core.rng import stream


def amdahl(p: float):
    return lambda m: 1.0 / (m * ((1 - p) + p / m))


def _action(rng, i: int) -> ActionSpec:
    return ActionSpec(
        action_id=f"a{i}",
        trajectory_id=f"t{i}",
        kind=ActionKind.CPU_TOOL,
        demand={"cpu": RangeSet(1, 32)},
        key_resource="cpu",
        t_ori_s=float(rng.lognormal(3.0, 1.0)),
        elasticity=amdahl(float(rng.uniform(0.8, 0.99))),
    )


def build(n: int, queue_extra: int, seed: int, lookahead: bool = False) -> ElasticScheduler:
    """`n + queue_extra` actions queued at `NOW`; with `lookahead`, after a history of 128
    actions that each started alone and finished before the next (one every 50 ms)."""
    rng = stream(seed, "bench-tangram")
    sched = ElasticScheduler(
        [CpuManager([CpuNode.uniform("n0", 256, 4, 4096.0)])],
        TangramConfig(lookahead_arrivals=lookahead),
    )
    if lookahead:
        for i in range(HISTORY):
            t = NOW - (HISTORY - i) * 0.05
            sched.submit(_action(rng, -1 - i), t)
            for s in sched.schedule(t):
                sched.finish(s.action.action_id, t + 0.01)
    for i in range(n + queue_extra):
        sched.submit(_action(rng, i), NOW)
    return sched


HISTORY, NOW = 128, 10.0


def measure(
    n: int, queue_extra: int, repeats: int = 30, lookahead: bool = False
) -> tuple[float, float, int]:
    """Median ms of the decision alone (`plan`: candidates, DPArrange, eviction) and of the
    whole pass (`schedule`: the decision plus each start's concrete core allocation)."""
    decide, full, started = [], [], 0
    for r in range(repeats):
        sched = build(n, queue_extra, r, lookahead)
        t0 = time.perf_counter()
        sched.plan(NOW)
        decide.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        started = len(sched.schedule(NOW))
        full.append(time.perf_counter() - t0)
    return statistics.median(decide) * 1e3, statistics.median(full) * 1e3, started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30, help="passes timed per setting")
    add_json_option(ap)
    args = ap.parse_args()
    records = []
    for n, extra, lookahead in [(64, 0, False), (64, 512, False), (64, 0, True), (64, 512, True)]:
        decide_ms, full_ms, started = measure(n, extra, args.repeats, lookahead)
        # 64 candidates at >= 1 core each fit 256 cores; the queue behind is estimated only.
        policy = "tangram_lookahead" if lookahead else "tangram"
        print(
            f"{policy} candidates={n} queued_behind={extra}: decision median {decide_ms:.3f} "
            f"ms, with allocation {full_ms:.3f} ms, started {started}"
        )
        records.append(
            {
                "record": "decision",
                "policy": policy,
                "candidates": n,
                "queued_behind": extra,
                "history": HISTORY if lookahead else 0,
                "repeats": args.repeats,
                "decision_ms": decide_ms,
                "with_allocation_ms": full_ms,
                "started": started,
            }
        )
    # the passes' seeds are their repeat numbers, 0 up
    if out := write_json(args.json, "bench_tangram_scheduler", records, seed=0):
        print(f"wrote {len(records)} records to {out}")


if __name__ == "__main__":
    main()
