"""Decision latency of RollMux's inter-group scheduler (Table 5) and of the exact optimum.

Run: python benchmarks/bench_rollmux.py
"""

from __future__ import annotations

from loom.experiments.rollmux import table5


def main() -> None:
    for row in table5(seed=1, quick=False):
        policy, jobs, groups, ms = row["policy"], row["jobs"], row["groups"], row["decision_ms"]
        print(f"{policy:8s} jobs={jobs:5d} groups={groups:4d} decision_ms={ms:.3f}")


if __name__ == "__main__":
    main()
