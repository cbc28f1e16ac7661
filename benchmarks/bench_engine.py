"""Bare event-engine throughput: events per second for a self-rescheduling workload.

Run: python benchmarks/bench_engine.py [--runs 5] [--events 400000] [--json PATH]

`--json PATH` writes one results document (`loom.bench.results`): a record `"rate"` with the
median, lowest and highest events per second and each run's.
"""

from __future__ import annotations

import argparse
import statistics
import time

from loom.bench.script import add_json_option, write_json
from loom.sim.engine import Engine

FANOUT = 64


def run_once(n_events: int = 400_000, fanout: int = FANOUT) -> float:
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--events", type=int, default=400_000, help="events rescheduled per run")
    add_json_option(ap)
    args = ap.parse_args()
    rates = [run_once(args.events) for _ in range(args.runs)]
    print(
        f"engine: median {statistics.median(rates) / 1e3:.0f}k events/s over {args.runs} runs "
        f"(min {min(rates) / 1e3:.0f}k, max {max(rates) / 1e3:.0f}k)"
    )
    record = {
        "record": "rate",
        "events": args.events,
        "fanout": FANOUT,
        "runs": args.runs,
        "events_per_s": statistics.median(rates),
        "events_per_s_min": min(rates),
        "events_per_s_max": max(rates),
        "events_per_s_runs": rates,
    }
    if out := write_json(args.json, "bench_engine", [record], seed=0):
        print(f"wrote 1 record to {out}")


if __name__ == "__main__":
    main()
