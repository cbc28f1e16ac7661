"""PlexRL (seed 004) on the simulators: `loom reproduce plexrl`.

* `table2` — bubble ratios of the three jobs' training pools, 1 − (compute_log_prob +
  update_actor + sync_weight) / cycle, from Table 2's phase times.
* `fig7b` — GPU-hours per effective training step: each job alone with its own training and
  rollout GPUs (Split-Async, one step stale), against PlexRL: two jobs of the model, each with
  its own rollout GPUs, time-slicing one training pool under HRRS (with FCFS beside it), state
  switches at the measured pinned bandwidth. GPU-hours count training and rollout GPUs over the
  run, divided by the steps completed (§6.2).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from loom.cluster.plexrl import OP_POLICIES, OpPolicyKind
from loom.experiments.report import Record, Task, bar_plot, by_experiment
from loom.sim.cluster.plexrl import GroupJob, NodeGroupSimulator
from loom.sim.workloads.plexrl import PlexJob, plexrl_jobs, state_costs

__all__ = ["fig7b_records", "plot", "run_experiments", "summary", "table2_records"]

TARGET = 0.10  # the issue's: each figure within 10% of the paper's


def table2_records() -> list[Record]:
    rows = []
    for job in plexrl_jobs():
        ratio = 1.0 - job.train_s / job.cycle_s
        rows.append(
            {
                "experiment": "table2",
                "model": job.model,
                "policy": "split_async",
                "cycle_s": job.cycle_s,
                "train_s": job.train_s,
                "bubble_ratio": ratio,
                "paper_bubble_ratio": job.bubble_ratio,
                "diff_pp": 100 * (ratio - job.bubble_ratio),
            }
        )
    return rows


def _group_jobs(job: PlexJob, copies: int, steps: int) -> list[GroupJob]:
    return [
        GroupJob(
            job_id=f"{job.key}-{i}",
            rollout_s=job.rollout_s,
            train_ops=job.train_ops,
            steps=steps,
        )
        for i in range(copies)
    ]


def _run(job: PlexJob, copies: int, steps: int, policy: OpPolicyKind) -> dict[str, float]:
    """`copies` jobs of `job` on one training pool: GPU-hours per completed step, and more."""
    costs = state_costs()

    def setup(to: str, resident: str | None) -> float:
        return (costs.offload_s(job) if resident is not None else 0.0) + costs.load_s(job)

    jobs = _group_jobs(job, copies, steps)
    res = NodeGroupSimulator(jobs, OP_POLICIES.get(policy)(), setup).run()
    rollout_gpu_s = sum(job.rollout_gpus * res.job_span_s(j.job_id) for j in jobs)
    train_gpu_s = job.train_gpus * res.span_s
    total_steps = copies * steps
    return {
        "gpu_hours_per_step": (rollout_gpu_s + train_gpu_s) / 3600 / total_steps,
        "step_time_s": sum(res.cycle_s(j.job_id) for j in jobs) / copies,
        "switches": float(res.switches()),
        "setup_share": res.setup_s() / res.span_s,
        "train_pool_busy": res.busy_s() / res.span_s,
        "gpus": float(copies * job.rollout_gpus + job.train_gpus),
    }


def fig7b_records(steps: int) -> list[Record]:
    rows = []
    for job in plexrl_jobs():
        alone = _run(job, 1, steps, OpPolicyKind.FCFS)
        base = {"experiment": "fig7b", "model": job.model, "steps": steps}
        rows.append({**base, "policy": "split_async", **alone, "saving_vs_split_async": 0.0})
        for label, kind in (("plexrl", OpPolicyKind.HRRS), ("plexrl_fcfs", OpPolicyKind.FCFS)):
            got = _run(job, 2, steps, kind)
            saving = 1.0 - got["gpu_hours_per_step"] / alone["gpu_hours_per_step"]
            rows.append(
                {
                    **base,
                    "policy": label,
                    **got,
                    "saving_vs_split_async": saving,
                    "paper_saving_vs_split_async": job.gpu_hours_saving_vs_split_async,
                }
            )
    return rows


def run_experiments(seed: int, quick: bool) -> tuple[int, Iterator[Task]]:
    """Table 2 and Fig. 7b (the rest of the issue's figures come in later work)."""
    del seed  # nothing here draws at random yet: Table 2's means drive every job
    steps = 20 if quick else 100  # §6.2: 100-step budgets
    tasks: list[Task] = [
        ("table2", table2_records),
        ("fig7b", lambda: fig7b_records(steps)),
    ]
    return len(tasks), iter(tasks)


def plot(records: list[Record], out: Path) -> list[Path]:
    by = by_experiment(records)
    paths = []
    if "table2" in by:
        paths.append(
            bar_plot(
                by["table2"],
                x="model",
                hue="policy",
                metric="bubble_ratio",
                path=out / "table2.png",
                title="Table 2: training-pool bubble ratio",
            )
        )
    if "fig7b" in by:
        paths.append(
            bar_plot(
                by["fig7b"],
                x="model",
                hue="policy",
                metric="gpu_hours_per_step",
                path=out / "fig7b.png",
                title="Fig. 7b: GPU-hours per effective step",
            )
        )
    return paths


def summary(records: list[Record]) -> list[Record]:
    rows: list[Record] = []
    for r in records:
        if r["experiment"] == "table2":
            rows.append(
                {
                    "experiment": "summary",
                    "of": "table2",
                    "model": r["model"],
                    "policy": r["policy"],
                    "ours": r["bubble_ratio"],
                    "paper": r["paper_bubble_ratio"],
                    "within_target": abs(r["diff_pp"]) <= 0.01,
                }
            )
        if r["experiment"] == "fig7b" and r["policy"] == "plexrl":
            ours, paper = r["saving_vs_split_async"], r["paper_saving_vs_split_async"]
            rows.append(
                {
                    "experiment": "summary",
                    "of": "fig7b",
                    "model": r["model"],
                    "policy": r["policy"],
                    "ours": ours,
                    "paper": paper,
                    "within_target": abs(ours / paper - 1) <= TARGET,
                }
            )
    return rows
