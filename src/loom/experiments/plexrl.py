"""PlexRL (seed 004) on the simulators: `loom reproduce plexrl`.

* `table2` — bubble ratios of the three jobs' training pools, 1 − (compute_log_prob +
  update_actor + sync_weight) / cycle, from Table 2's phase times.
* `fig7b` — GPU-hours per effective training step: each job alone with its own training and
  rollout GPUs (Split-Async, one step stale), against PlexRL: two jobs of the model, each with
  its own rollout GPUs, time-slicing one training pool under HRRS (with FCFS beside it), state
  switches at the measured pinned bandwidth; and Colocated: rollout and training on the
  training GPUs in turn, the rollout spread over them (DP = training GPUs / TP_R) and sped up
  as the decode model below says, two mode switches a step (`StateCosts.colocated_switch_s`).
  GPU-hours count training and rollout GPUs over the run, divided by the steps completed.
* `fig7c` — decode throughput of a rollout at the job's rollout DP (PlexRL) and at the
  colocated DP, as the ratio of its real to its saturated throughput AUC (`loom.sim.rollout.
  tail`), on 1,024 responses of the repository's long-tailed math workload.
* `fig8` — a trace of RL jobs on a fixed cluster of training node groups under Isolated, Pack,
  Spread and Spread+Backfill (`loom.sim.cluster.plexrl_trace`): each job's queueing delay over
  its own duration, and the time to drain the trace; `fig8_load` repeats it at other offered
  loads, since the paper's trace (three months of its cluster) is not public.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path

import numpy as np

from loom.cluster.plexrl import OP_POLICIES, OpPolicyKind
from loom.experiments.report import Record, Task, bar_plot, by_experiment, line_plot
from loom.perf.latency import RooflineLatencyModel
from loom.sim.cluster.plexrl import GroupJob, NodeGroupSimulator
from loom.sim.cluster.plexrl_trace import Sharing, TraceSimulator
from loom.sim.metrics import GpuMeter
from loom.sim.rollout.tail import DecodeCurve, decode_curve
from loom.sim.workloads.agentic import AgenticWorkload, WorkloadKind
from loom.sim.workloads.plexrl import PlexJob, job_trace, plexrl_jobs, state_costs

__all__ = [
    "fig7b_records",
    "fig7c_records",
    "fig8_records",
    "plot",
    "run_experiments",
    "summary",
    "table2_records",
]

TARGET = 0.10  # the issue's: each figure within 10% of the paper's
GPU = "h100"  # assumed: §6.1 names a 2,048-GPU cluster, not its GPU type
PROMPTS, SAMPLES = 64, 16  # assumed: 1,024 responses a step (§6.1 gives no batch size)
MAX_RESPONSE = 32_768  # assumed: a thinking model's usual response cap in RLVR
MAX_RUNNING = 256  # vLLM's default max_num_seqs
FIG7C_PAPER = {"plexrl": 0.7503, "colocated": 0.5274}  # §6.2, the 235B job
FIG8_PAPER_DRAIN = {"spread_backfill": 0.56}  # §6.3: 56.0% of Isolated's time to drain
FIG8_LOAD = 1.5  # assumed: arrivals offer 1.5x what the groups hold one job each


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
    warm_s = costs.switch_cost(job).warm_s

    def setup(to: str, resident: str | None) -> float:
        return (costs.offload_s(job) if resident is not None else 0.0) + warm_s

    jobs = _group_jobs(job, copies, steps)
    res = NodeGroupSimulator(jobs, OP_POLICIES.get(policy)(), setup).run()
    meter = GpuMeter()  # the meter RollMux's simulator keeps, over fixed pools here
    for j in jobs:  # each job's rollout GPUs until its last step; the shared training pool
        meter.hold("rollout", job.rollout_gpus, j.arrival_s, j.arrival_s + res.job_span_s(j.job_id))
    meter.hold("training", job.train_gpus, 0.0, res.span_s)
    meter.use("training", job.train_gpus * res.busy_s())
    total_steps = copies * steps
    return {
        "gpu_hours_per_step": meter.gpu_hours() / total_steps,
        "step_time_s": sum(res.cycle_s(j.job_id) for j in jobs) / copies,
        "switches": float(res.switches()),
        "setup_share": res.setup_s() / res.span_s,
        "train_pool_busy": meter.busy["training"] / meter.provisioned["training"],
        "gpus": float(copies * job.rollout_gpus + job.train_gpus),
    }


def fig7b_records(steps: int, seed: int = 1) -> list[Record]:
    rows = []
    for job in plexrl_jobs():
        alone = _run(job, 1, steps, OpPolicyKind.FCFS)
        base = {"experiment": "fig7b", "model": job.model, "steps": steps}
        rows.append({**base, "policy": "split_async", **alone, "saving_vs_split_async": 0.0})
        col = colocated(job, seed)
        rows.append(
            {
                **base,
                "policy": "colocated",
                **col,
                "saving_vs_split_async": 1.0
                - col["gpu_hours_per_step"] / alone["gpu_hours_per_step"],
            }
        )
        for label, kind in (("plexrl", OpPolicyKind.HRRS), ("plexrl_fcfs", OpPolicyKind.FCFS)):
            got = _run(job, 2, steps, kind)
            saving = 1.0 - got["gpu_hours_per_step"] / alone["gpu_hours_per_step"]
            rows.append(
                {
                    **base,
                    "policy": label,
                    **got,
                    "saving_vs_split_async": saving,
                    "paper_saving_vs_split_async": (
                        job.gpu_hours_saving_vs_split_async if label == "plexrl" else None
                    ),  # §6.2 states PlexRL's (HRRS) saving only
                }
            )
    return rows


@cache
def _lengths(seed: int) -> tuple[int, ...]:
    wl = AgenticWorkload(
        kind=WorkloadKind.MATH,
        model="qwen3-14b",
        num_prompts=PROMPTS,
        samples=SAMPLES,
        prompt_seed=seed,
        max_output_tokens=MAX_RESPONSE,
    )
    return tuple(max(1, t.output_tokens) for t in wl.sample(0))


def colocated_replicas(job: PlexJob) -> int:
    return job.train_gpus // job.tp_r


@cache
def _curve(key: str, replicas: int, seed: int) -> DecodeCurve:
    job = next(j for j in plexrl_jobs() if j.key == key)
    latency = RooflineLatencyModel(GPU, job.model, tp=job.tp_r)
    return decode_curve(_lengths(seed), replicas=replicas, latency=latency, max_running=MAX_RUNNING)


def colocated(job: PlexJob, seed: int) -> dict[str, float]:
    """One colocated step: the rollout over every training GPU (as fast as the decode model
    says, relative to Table 2's rollout at DP_R), then training, and two mode switches."""
    own = _curve(job.key, job.dp_r, seed)
    spread = _curve(job.key, colocated_replicas(job), seed)
    rollout_s = job.rollout_s * spread.makespan_s / own.makespan_s
    switch_s = state_costs().colocated_switch_s(job)
    step_s = rollout_s + job.train_s + switch_s
    return {
        "gpu_hours_per_step": job.train_gpus * step_s / 3600,
        "step_time_s": step_s,
        "rollout_time_s": rollout_s,
        "switch_s": switch_s,
        "gpus": float(job.train_gpus),
    }


def fig7c_records(seed: int) -> list[Record]:
    rows = []
    for job in plexrl_jobs():
        for policy, replicas in (("plexrl", job.dp_r), ("colocated", colocated_replicas(job))):
            c = _curve(job.key, replicas, seed)
            paper = FIG7C_PAPER.get(policy) if job.key == "235b" else None
            rows.append(
                {
                    "experiment": "fig7c",
                    "model": job.model,
                    "policy": policy,
                    "replicas": replicas,
                    "tp": job.tp_r,
                    "throughput_auc_ratio": c.auc_ratio,
                    "observed_auc_ratio": c.observed_auc_ratio,
                    "per_gpu_tok_s": c.per_gpu_tok_s,
                    "rollout_time_s": c.makespan_s,
                    "paper_throughput_auc_ratio": paper,
                }
            )
    return rows


def fig8_records(
    seed: int, *, jobs: int, groups: int, load: float, tag: str = "fig8"
) -> list[Record]:
    trace = job_trace(seed, jobs=jobs, groups=groups, load=load)
    horizon = max(j.duration_s + j.footprint.period for j in trace) + 1
    rows: list[Record] = []
    cdf: list[Record] = []
    for policy in Sharing:
        res = TraceSimulator(
            trace, groups=groups, nodes_per_group=1, policy=policy, horizon=horizon
        ).run()
        delays = np.array([r.normalized_delay for r in res.records])
        rows.append(
            {
                "experiment": tag,
                "policy": policy.value,
                "model": "mixed",
                "jobs": jobs,
                "groups": groups,
                "load": load,
                "time_to_drain_s": res.drain_s,
                "queue_delay_p50": float(np.percentile(delays, 50)),
                "queue_delay_p90": float(np.percentile(delays, 90)),
                "queue_delay_p99": float(np.percentile(delays, 99)),
                "backfilled": sum(r.backfilled for r in res.records),
            }
        )
        if tag == "fig8":  # the CDF, as tidy records: the delay at each 5% of the jobs
            for q in range(0, 101, 5):
                cdf.append(
                    {
                        "experiment": "fig8_cdf",
                        "policy": policy.value,
                        "model": "mixed",
                        "share": q / 100,
                        "queue_delay": float(np.percentile(delays, q)),
                    }
                )
    iso = next(r for r in rows if r["policy"] == "isolated")["time_to_drain_s"]
    for r in rows:
        r["drain_vs_isolated"] = r["time_to_drain_s"] / iso
        r["paper_drain_vs_isolated"] = FIG8_PAPER_DRAIN.get(r["policy"]) if tag == "fig8" else None
    return rows + cdf


def run_experiments(seed: int, quick: bool) -> tuple[int, Iterator[Task]]:
    """Table 2, Fig. 7b, Fig. 7c and Fig. 8 (with a load sweep)."""
    steps = 20 if quick else 100  # §6.2: 100-step budgets
    jobs, groups = (80, 6) if quick else (300, 16)
    tasks: list[Task] = [
        ("table2", table2_records),
        ("fig7b", lambda: fig7b_records(steps, seed)),
        ("fig7c", lambda: fig7c_records(seed)),
        ("fig8", lambda: fig8_records(seed, jobs=jobs, groups=groups, load=FIG8_LOAD)),
    ]
    for load in (1.0, 2.0, 3.0):
        tasks.append(
            (
                f"fig8_load {load:g}",
                lambda load=load: fig8_records(  # type: ignore[misc]
                    seed, jobs=jobs, groups=groups, load=load, tag="fig8_load"
                ),
            )
        )
    return len(tasks), iter(tasks)


BARS = (  # experiment, file, metric, the paper's (as stated, §6), y label, title; models on x
    (
        "table2",
        "table2",
        "bubble_ratio",
        "paper_bubble_ratio",  # Table 2
        "bubble ratio (fraction of the cycle)",
        "Table 2: training-pool bubble ratio",
    ),
    (
        "fig7b",
        "fig7b",
        "gpu_hours_per_step",
        None,
        "GPU-hours per step (GPU·h)",
        "Fig. 7b: GPU-hours per effective step",
    ),
    (
        "fig7b",
        "fig7b_saving",
        "saving_vs_split_async",
        "paper_saving_vs_split_async",  # §6.2, stated per job
        "GPU-hour saving (fraction)",
        "Fig. 7b: saving over split async",
    ),
    (
        "fig7c",
        "fig7c",
        "throughput_auc_ratio",
        "paper_throughput_auc_ratio",  # §6.2, the 235B job
        "real / saturated AUC (ratio)",
        "Fig. 7c: real / saturated throughput AUC",
    ),
)


def plot(records: list[Record], out: Path) -> list[Path]:
    """Table 2 and Fig. 7b/7c as bars, the paper's values as black markers; Fig. 8 as the
    drain time over Isolated's (the paper's §6.3 figure beside it) and the CDF of queueing
    delay."""
    by = by_experiment(records)
    paths = [
        bar_plot(
            by[exp],
            x="model",
            hue="policy",
            metric=metric,
            paper=paper,
            ylabel=ylabel,
            path=out / f"{stem}.png",
            title=title,
        )
        for exp, stem, metric, paper, ylabel, title in BARS
        if exp in by
    ]
    if "fig8" in by:
        paths.append(
            bar_plot(
                by["fig8"],
                x="model",
                hue="policy",
                metric="drain_vs_isolated",
                paper="paper_drain_vs_isolated",  # §6.3: 56.0% of Isolated's time
                xlabel="job trace",
                ylabel="time to drain / Isolated's (ratio)",
                path=out / "fig8_drain.png",
                title="Fig. 8: time to drain the trace",
            )
        )
    if "fig8_cdf" in by:
        paths.append(
            line_plot(
                by["fig8_cdf"],
                x="queue_delay",
                metric="share",
                hue="policy",
                facet="model",
                xlabel="queueing delay / job duration (ratio)",
                ylabel="share of jobs (CDF, fraction)",
                path=out / "fig8.png",
                title="Fig. 8: CDF of queueing delay / job duration",
            )
        )
    return paths


# (experiment, our metric, the paper's) of each headline figure; Table 2 is judged in points
SUMMARY = (
    ("table2", "bubble_ratio", "paper_bubble_ratio"),
    ("fig7b", "saving_vs_split_async", "paper_saving_vs_split_async"),
    ("fig7c", "throughput_auc_ratio", "paper_throughput_auc_ratio"),
    ("fig8", "drain_vs_isolated", "paper_drain_vs_isolated"),
)


def summary(records: list[Record]) -> list[Record]:
    """Ours beside the paper's: Table 2 within 0.01 points, the rest within 10%."""
    rows: list[Record] = []
    for r in records:
        for exp, ours_key, paper_key in SUMMARY:
            if r["experiment"] != exp or not r.get(paper_key):
                continue
            if exp == "fig7b" and r["policy"] != "plexrl":
                continue
            ours, paper = r[ours_key], r[paper_key]
            within = (
                abs(100 * (ours - paper)) <= 0.01
                if exp == "table2"
                else abs(ours / paper - 1) <= TARGET
            )
            rows.append(
                {
                    "experiment": "summary",
                    "of": exp,
                    "model": r["model"],
                    "policy": r["policy"],
                    "ours": ours,
                    "paper": paper,
                    "within_target": within,
                }
            )
    return rows
