"""Bare event-engine throughput: events per second for a self-rescheduling workload.

Run: python benchmarks/bench_engine.py
"""

from __future__ import annotations

import statistics
import time

from loom.sim.engine import Engine


def run_once(n_events: int = 400_000, fanout: int = 64) -> float:
    eng = Engine()
    remaining = [n_events]

    def tick(i: int) -> None:
        if remaining[0] > 0:
            remaining[0] -= 1
            eng.after(1.0 + (i * 7919 % 13) * 0.01, tick, i)

    for i in range(fanout):
        eng.schedule(0.0, tick, i)
    t0 = time.perf_counter()
    ran = eng.run()
    return ran / (time.perf_counter() - t0)


def main() -> None:
    rates = [run_once() for _ in range(5)]
    print(
        f"engine: median {statistics.median(rates) / 1e3:.0f}k events/s over 5 runs "
        f"(min {min(rates) / 1e3:.0f}k, max {max(rates) / 1e3:.0f}k)"
    )


if __name__ == "__main__":
    main()
