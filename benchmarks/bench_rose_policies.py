"""Decision latency of ROSE's policies (targets, medians): routing a turn over 80 workers with
16k trajectories known ≤ 0.1 ms; one admission tick (Eq. 1 or 2 over the serving queue, then
the decision) ≤ 20 µs; an emergency cut over 256 running rollout requests ≤ 1 ms.

    python benchmarks/bench_rose_policies.py [--repeats 2000] [--json PATH]

`--json PATH` writes one results document (`loom.bench.results`): a record `"decision"` per
policy step, with its median, p99 and target in microseconds.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass, field

from loom.bench.script import add_json_option, write_json
from loom.core.rng import stream
from loom.rollout.rose import (
    AdmissionKind,
    ElasticRouter,
    MemoryConfig,
    MemorySharing,
    Role,
    ServingSlo,
    WorkerKind,
    admits,
    slack_s,
    tpot_slack_s,
    ttft_slack_s,
)


@dataclass
class _Worker:
    idx: int
    kind: WorkerKind
    gpus: int
    running: int
    alive: bool = True
    activated: bool = True
    version: int = 0
    free_pages: int = 4000
    slack_s: float = math.inf
    prefixes: set[int] = field(default_factory=set)

    def holds_prefix(self, traj_id: int) -> bool:
        return traj_id in self.prefixes


def _median_us(fn, repeats: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    times.sort()
    return statistics.median(times), times[int(0.99 * (len(times) - 1))]


def bench_routing(repeats: int) -> tuple[float, float]:
    rng = stream(1, "bench-rose-routing")
    workers = [_Worker(i, WorkerKind.DEDICATED, 1, int(rng.integers(0, 17))) for i in range(16)]
    workers += [
        _Worker(i, WorkerKind.LENT, 1, int(rng.integers(0, 17)), slack_s=float(rng.uniform(-1, 1)))
        for i in range(16, 80)
    ]
    router = ElasticRouter()
    n_traj = 16_384
    for t in range(n_traj):  # 16k trajectories with a history (affinity) in the router
        router._last[t] = int(rng.integers(0, 80))
        if rng.random() < 0.5:
            workers[router._last[t]].prefixes.add(t)
    picks = rng.integers(0, n_traj, repeats + 1)
    it = iter(picks.tolist())

    def one() -> None:
        t = next(it)
        router.submit(t, 8, 64, workers)
        router.withdraw(t)

    return _median_us(one, repeats)


def bench_admission(repeats: int) -> tuple[float, float]:
    rng = stream(1, "bench-rose-admission")
    slo = ServingSlo(ttft_s=0.5, tpot_s=0.15)
    queued = [(float(rng.uniform(0, 0.4)), int(rng.integers(100, 4000))) for _ in range(8)]
    lasts = [float(rng.uniform(0.3, 0.45)) for _ in range(64)]
    prefill = lambda n: 2e-5 * n  # noqa: E731
    decode = lambda b: 0.012 + 1e-4 * b  # noqa: E731
    roles = [Role.PREFILL, Role.DECODE]
    k = iter(range(repeats + 1))

    def one() -> None:
        role = roles[next(k) & 1]
        if role == Role.PREFILL:
            s = slack_s(role, AdmissionKind.DUAL_SLO, ttft_slack_s(queued, 0.45, slo, prefill), 0)
        else:
            s = slack_s(role, AdmissionKind.DUAL_SLO, 0, tpot_slack_s(lasts, 0.45, slo, decode))
        admits(s, 0.02)

    return _median_us(one, repeats)


def bench_cut(repeats: int) -> tuple[float, float]:
    cfg = MemoryConfig(pool_pages=40_000, headroom_pages=8_000)
    states = []
    for _ in range(repeats):
        m = MemorySharing(cfg)
        m.begin_step(0, 0.0)
        for r in range(256):
            assert m.admit(r, 50, traj_id=r)
        for r in range(0, 256, 4):
            m.finish(r, r, now=1.0)  # a quarter hold leases
        states.append(m)
    it = iter(states)
    return _median_us(lambda: next(it).set_serving(31_000, now=2.0), repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2000)
    add_json_option(ap)
    args = ap.parse_args()
    cut_repeats = min(args.repeats, 500)
    rows = [
        ("route", "route a turn: 80 workers, 16k trajectories", bench_routing(args.repeats), 100.0),
        (
            "admission",
            "admission tick (Eq. 1 or 2 + decision)",
            bench_admission(args.repeats),
            20.0,
        ),
        ("cut", "emergency cut over 256 requests", bench_cut(cut_repeats), 1000.0),
    ]
    records = []
    for step, name, (med, p99), target in rows:
        verdict = "met" if med <= target else "NOT met"
        print(
            f"{name:45s} median {med:8.1f} us  p99 {p99:8.1f} us  target {target:g} us: {verdict}"
        )
        records.append(
            {
                "record": "decision",
                "step": step,
                "name": name,
                "repeats": cut_repeats if step == "cut" else args.repeats,
                "median_us": med,
                "p99_us": p99,
                "target_us": target,
                "met": med <= target,
            }
        )
    # the draws' seed is fixed (1, one stream per step)
    if out := write_json(args.json, "bench_rose_policies", records, seed=1):
        print(f"wrote {len(records)} records to {out}")


if __name__ == "__main__":
    main()
