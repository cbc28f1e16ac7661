"""Decision latency of Tangram's elastic scheduler: 64 queued scalable candidates over one
256-core node (the issue's target: within 1 ms), and the same with a deep queue behind them.

    python benchmarks/bench_tangram_scheduler.py
"""

from __future__ import annotations

import statistics
import time

from loom.actions.managers.cpu import CpuManager, CpuNode
from loom.actions.tangram.scheduler import ElasticScheduler
from loom.core.actions import ActionKind, ActionSpec
from loom.core.resources import RangeSet
from loom.sim.rng import stream


def amdahl(p: float):
    return lambda m: 1.0 / (m * ((1 - p) + p / m))


def build(n: int, queue_extra: int, seed: int) -> ElasticScheduler:
    rng = stream(seed, "bench-tangram")
    sched = ElasticScheduler([CpuManager([CpuNode.uniform("n0", 256, 4, 4096.0)])])
    for i in range(n + queue_extra):
        sched.submit(
            ActionSpec(
                action_id=f"a{i}",
                trajectory_id=f"t{i}",
                kind=ActionKind.CPU_TOOL,
                demand={"cpu": RangeSet(1, 32)},
                key_resource="cpu",
                t_ori_s=float(rng.lognormal(3.0, 1.0)),
                elasticity=amdahl(float(rng.uniform(0.8, 0.99))),
            ),
            0.0,
        )
    return sched


def measure(n: int, queue_extra: int, repeats: int = 30) -> tuple[float, float, int]:
    """Median ms of the decision alone (`plan`: candidates, DPArrange, eviction) and of the
    whole pass (`schedule`: the decision plus each start's concrete core allocation)."""
    decide, full, started = [], [], 0
    for r in range(repeats):
        sched = build(n, queue_extra, r)
        t0 = time.perf_counter()
        sched.plan(0.0)
        decide.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        started = len(sched.schedule(0.0))
        full.append(time.perf_counter() - t0)
    return statistics.median(decide) * 1e3, statistics.median(full) * 1e3, started


def main() -> None:
    for n, extra in [(64, 0), (64, 512)]:
        decide_ms, full_ms, started = measure(n, extra)
        # 64 candidates at >= 1 core each fit 256 cores; the queue behind is estimated only.
        print(
            f"candidates={n} queued_behind={extra}: decision median {decide_ms:.3f} ms, "
            f"with allocation {full_ms:.3f} ms, started {started}"
        )


if __name__ == "__main__":
    main()
