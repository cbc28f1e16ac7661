"""Decision latency of RollMux's inter-group scheduler (Table 5) and of the exact optimum.

Run: python benchmarks/bench_rollmux.py [--quick] [--seed 1] [--json PATH]

`--quick` gives the exact optimum 10 s a size instead of 60 (one it does not finish in reads
nan). `--json PATH` writes one results document (`loom.bench.results`): a record `"decision"`
per policy and size, as printed.
"""

from __future__ import annotations

import argparse

from loom.bench.script import add_json_option, write_json
from loom.experiments.rollmux import table5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10 s for the exact optimum, not 60")
    ap.add_argument("--seed", type=int, default=1)
    add_json_option(ap)
    args = ap.parse_args()
    records = []
    for row in table5(seed=args.seed, quick=args.quick):
        policy, jobs, groups, ms = row["policy"], row["jobs"], row["groups"], row["decision_ms"]
        print(f"{policy:8s} jobs={jobs:5d} groups={groups:4d} decision_ms={ms:.3f}")
        records.append(
            {
                "record": "decision",
                "policy": policy,
                "jobs": jobs,
                "groups": groups,
                "decision_ms": ms,
            }
        )
    if out := write_json(args.json, "bench_rollmux", records, seed=args.seed):
        print(f"wrote {len(records)} records to {out}")


if __name__ == "__main__":
    main()
