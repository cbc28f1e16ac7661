"""Check ROSE's workload shapes (`loom.sim.workloads.rose`) against the paper's Fig. 1.

Calibration targets, all from ROSE's characterization (seed 002), none from its results:

* §2.2 "The Impact of Prefill": prefill tokens are 77% (Qwen3-8B, FrozenLake) and 86%
  (Qwen3-32B, ALFWorld) of all tokens. Measured as `prefill_share`: every turn re-sends its
  whole context, prefill = Σ context before each turn's output, total = prefill + output.
* §2.2 "Long-tail Rollouts" (Fig. 1b): P75 of trajectory time is at most 30% of the rollout;
  §4.1: P75 around 55-145 s, tails over 400 s.
* Fig. 1c: Qwen3-8B rollout time falls from 607 s to 435 s as GPUs are added (8 GPUs upward).
* Fig. 1a: rollout takes over 70% of a synchronous step (rollout + training).

The characterization ran §2.2's setup: batch 256 with group size 8, 16 H800 GPUs (8B: 8 GPUs
at Fig. 1c's first point). §6's dedicated setup (group 16; 8B: 256 trajectories on 8 GPUs TP1;
32B: 1024 on 16 GPUs as 4 workers of TP4; 16 running turns per GPU) is reported beside it, not
fitted. Rollouts run in `RolloutSimulator` under FCFS with verl's cache-aware pinning.

    python benchmarks/calibrate_rose_workloads.py                  # steps 0-3, seed 0
    python benchmarks/calibrate_rose_workloads.py --steps 8 --seed 1

`--json PATH` writes one results document (`loom.bench.results`): a record `"targets"`,
`"rollout"` per setup and step, `"rollout_mean"` per setup (the steps' means), `"dapo"` and
`"spot"` per model.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from typing import Any

import numpy as np

from loom.bench.script import add_json_option, write_json
from loom.rollout.baselines import CacheAwareRouter, FcfsScheduler
from loom.rollout.policy import WorkerLayout
from loom.sim.rollout.simulator import RolloutSimulator
from loom.sim.workloads.rose import (
    ROSE_WORKLOADS,
    Algorithm,
    RoseWorkload,
    prefill_share,
    serverless_lease,
    spot_trace,
    train_time_s,
    train_tokens,
)

PREFILL_SHARE = {"8b": 0.77, "32b": 0.86}  # §2.2
P75_OVER_ROLLOUT_MAX = 0.30  # §2.2, Fig. 1b
P75_RANGE_S = (55, 145)  # §4.1
TAIL_OVER_S = 400  # §4.1
FIG1C_8B_S = (435, 607)  # Fig. 1c, §2.2
ROLLOUT_SHARE_MIN = 0.70  # Fig. 1a

Record = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Setup:
    name: str
    key: str
    workload: RoseWorkload
    gpus: int  # rollout GPUs (workers of workload.rollout_tp)


def setups(seed: int) -> list[Setup]:
    w8 = dataclasses.replace(ROSE_WORKLOADS["8b"], seed=seed)
    w32 = dataclasses.replace(ROSE_WORKLOADS["32b"], seed=seed)
    fig1 = {"group": 8, "batch": 256}  # §2.2: batch 256, group size 8
    return [
        Setup("fig1 (§2.2)", "8b", dataclasses.replace(w8, **fig1), 8),
        Setup("fig1 (§2.2)", "8b", dataclasses.replace(w8, **fig1), 16),
        Setup("fig1 (§2.2)", "32b", dataclasses.replace(w32, **fig1), 16),
        Setup("dedicated (§6)", "8b", w8, w8.rollout_gpus),
        Setup("dedicated (§6)", "32b", w32, w32.rollout_gpus),
    ]


def measure(s: Setup, step: int) -> dict[str, float]:
    w = s.workload
    trajs = w.sample(step)
    layout = WorkerLayout(degrees=(w.rollout_tp,) * (s.gpus // w.rollout_tp))
    res = RolloutSimulator(
        trajs, layout, FcfsScheduler(), CacheAwareRouter(), w.rollout_config()
    ).run()
    p75 = float(np.percentile(res.finish_s, 75))
    train = train_time_s(w, train_tokens(trajs))
    return {
        "prefill_share": prefill_share(trajs),
        "makespan_s": res.makespan_s,
        "p75_s": p75,
        "p75_over_makespan": p75 / res.makespan_s,
        "p99_s": float(np.percentile(res.finish_s, 99)),
        "train_s": train,
        "rollout_share": res.makespan_s / (res.makespan_s + train),
    }


def targets() -> Record:
    """The paper's figures the workloads are checked against."""
    return {
        "record": "targets",
        "prefill_share_8b": PREFILL_SHARE["8b"],
        "prefill_share_32b": PREFILL_SHARE["32b"],
        "prefill_share_tolerance": 0.03,
        "p75_over_makespan_max": P75_OVER_ROLLOUT_MAX,
        "p75_min_s": P75_RANGE_S[0],
        "p75_max_s": P75_RANGE_S[1],
        "tail_over_s": TAIL_OVER_S,
        "fig1c_8b_from_s": FIG1C_8B_S[1],
        "fig1c_8b_toward_s": FIG1C_8B_S[0],
        "rollout_share_min": ROLLOUT_SHARE_MIN,
    }


def report_rollouts(steps: int, seed: int) -> list[Record]:
    print(f"Rollouts (steps 0..{steps - 1}, seed {seed}); per-step values, then the mean")
    print(
        f"targets: prefill share 8B {PREFILL_SHARE['8b']:.0%} / 32B {PREFILL_SHARE['32b']:.0%} "
        f"(±3 pp); P75/makespan <= {P75_OVER_ROLLOUT_MAX:.0%}; P75 {P75_RANGE_S[0]}-"
        f"{P75_RANGE_S[1]} s; tail > {TAIL_OVER_S} s; 8B at 8 GPUs {FIG1C_8B_S[1]} s falling "
        f"toward {FIG1C_8B_S[0]} s; rollout > {ROLLOUT_SHARE_MIN:.0%} of rollout + training"
    )
    records = [targets()]
    for s in setups(seed):
        rows = [measure(s, step) for step in range(steps)]
        w = s.workload
        workers = s.gpus // w.rollout_tp
        setup = {"setup": s.name, "model": s.key, "batch": w.batch, "groups": w.groups}
        setup |= {"group": w.group, "gpus": s.gpus, "workers": workers, "tp": w.rollout_tp}
        setup |= {"running_per_worker": w.max_running_per_gpu * w.rollout_tp}
        setup |= {"train_gpus": w.train_gpus}
        records += [{"record": "rollout", **setup, "step": i, **r} for i, r in enumerate(rows)]
        mean = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
        records.append({"record": "rollout_mean", **setup, "steps": steps, **mean})

        def col(name: str, fmt: str, rows: list[dict[str, float]] = rows) -> str:
            vals = [r[name] for r in rows]
            return " ".join(fmt.format(v) for v in vals) + " | " + fmt.format(statistics.mean(vals))

        print(
            f"\n{s.name} {s.key}: batch {w.batch} = {w.groups} groups of {w.group}, "
            f"{s.gpus} GPUs as {s.gpus // w.rollout_tp} x TP{w.rollout_tp}, "
            f"{w.max_running_per_gpu * w.rollout_tp} running turns per worker"
        )
        print(f"  prefill share    {col('prefill_share', '{:.3f}')}")
        print(f"  makespan s       {col('makespan_s', '{:.0f}')}")
        print(f"  P75 s            {col('p75_s', '{:.0f}')}")
        print(f"  P75 / makespan   {col('p75_over_makespan', '{:.2f}')}")
        print(f"  P99 s            {col('p99_s', '{:.0f}')}")
        print(f"  train s          {col('train_s', '{:.0f}')}  ({w.train_gpus} GPUs)")
        print(f"  rollout share    {col('rollout_share', '{:.2f}')}")
    return records


def report_dapo(seed: int) -> list[Record]:
    print(f"\nDAPO redundant sampling (seed {seed}): groups launched / batch groups per step")
    records = []
    for key, w in ROSE_WORKLOADS.items():
        w = dataclasses.replace(w, seed=seed)
        n = w.steps[Algorithm.DAPO]
        mult = [w.dapo_groups(step) / w.groups for step in range(n)]
        q = [w.dapo.validity_prob(step, seed) for step in range(n)]
        print(
            f"  {key}: P(valid) {min(q):.2f}-{max(q):.2f}; launches mean "
            f"{statistics.mean(mult):.2f}x, max {max(mult):.2f}x "
            f"(cap {w.dapo.max_launch_multiple}x; Fig. 1d: up to 5.7x)"
        )
        print("      " + " ".join(f"{m:.1f}" for m in mult))
        records.append(
            {
                "record": "dapo",
                "model": key,
                "steps": n,
                "valid_prob_min": min(q),
                "valid_prob_max": max(q),
                "launch_multiple_mean": statistics.mean(mult),
                "launch_multiple_max": max(mult),
                "launch_multiple_cap": w.dapo.max_launch_multiple,
                "paper_launch_multiple_max": 5.7,
                "launch_multiples": mult,
            }
        )
    return records


def report_elastic(seed: int) -> list[Record]:
    print(f"\nSpot traces (seed {seed}; GPUs per 5-min slot) and serverless leases")
    records = []
    for key in ROSE_WORKLOADS:
        tr, lease = spot_trace(key, seed), serverless_lease(key)
        rec = tr.recovery
        gpu_s = sum(tr.slots()) * tr.slot_s
        print(f"  {key}: {tr.slots()}")
        print(
            f"      mean {tr.mean_fraction:.2f} of {tr.max_gpus}, {len(tr.steps) - 1} changes, "
            f"{tr.gpus_lost} GPUs lost, {tr.gpus_gained} gained; recovery {rec.total_s:.0f} s "
            f"= acquire {rec.acquire_s:.0f} + load {rec.model_load_s:.0f} + init "
            f"{rec.runtime_init_s:.0f} + sync {rec.weight_sync_s:.0f}"
        )
        print(
            f"      informational, not a target: lost x recovery / spot GPU time = "
            f"{tr.gpus_lost * rec.total_s / gpu_s:.1%}"
        )
        print(
            f"      lambda-RL: {lease.gpus} GPUs, lease {lease.lease_s:.0f} s, cold start "
            f"{lease.cold_start.total_s:.0f} s, expiries in 2 h at {lease.expiries(tr.horizon_s)}"
        )
        records.append(
            {
                "record": "spot",
                "model": key,
                "slot_s": tr.slot_s,
                "horizon_s": tr.horizon_s,
                "slots_gpus": tr.slots(),
                "max_gpus": tr.max_gpus,
                "mean_fraction": tr.mean_fraction,
                "changes": len(tr.steps) - 1,
                "gpus_lost": tr.gpus_lost,
                "gpus_gained": tr.gpus_gained,
                "recovery_s": rec.total_s,
                "acquire_s": rec.acquire_s,
                "model_load_s": rec.model_load_s,
                "runtime_init_s": rec.runtime_init_s,
                "weight_sync_s": rec.weight_sync_s,
                "lost_recovery_share": tr.gpus_lost * rec.total_s / gpu_s,
                "lease_gpus": lease.gpus,
                "lease_s": lease.lease_s,
                "cold_start_s": lease.cold_start.total_s,
                "lease_expiries_s": lease.expiries(tr.horizon_s),
            }
        )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="rollout steps per setup")
    parser.add_argument("--seed", type=int, default=0)
    add_json_option(parser)
    args = parser.parse_args()
    records = report_rollouts(args.steps, args.seed)
    records += report_dapo(args.seed)
    records += report_elastic(args.seed)
    if out := write_json(args.json, "calibrate_rose_workloads", records, seed=args.seed):
        print(f"wrote {len(records)} records to {out}")


if __name__ == "__main__":
    main()
