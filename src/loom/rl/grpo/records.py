"""What a GRPO run records: one record per job and step (its reward, the time of each phase, its
tokens, the importance ratio's spread, the weight sync's bytes), written as JSON lines beside a
summary, a reward curve and a phase-time plot."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PHASES", "StepRecord", "plot", "summarize", "write_records"]

# the phases of a step, in the order they run
PHASES = ("wait", "switch", "sync", "rollout", "tool", "reward", "train")


@dataclass(kw_only=True)
class StepRecord:
    job: str
    task: str
    step: int
    version: int  # the weights the rollout ran on (the job's own numbering)
    router_version: int  # what the router called them (one number per load into the engines)
    start_s: float  # since the run began
    end_s: float
    reward_mean: float
    reward_std: float
    samples: int
    turns: int
    tool_calls: int
    prompt_tokens: int
    generated_tokens: int
    # seconds per phase: waiting for the engines, loading another job's weights (switch,
    # with the node group's offload/load), loading this job's new version (sync, with the
    # publication), rollout turns, tool calls, reward, training
    phase_s: dict[str, float] = field(default_factory=dict)
    logprob_diff_max: float | None = None  # engines vs trainer on the step's samples
    ratio: dict[str, float] | None = None  # the importance ratio: mean, std, min, max
    clipped: float = 0.0
    loss: float = 0.0
    grad_norm: float = 0.0
    sync_bytes: int = 0  # bytes published for the next version
    sync_dense_bytes: int = 0  # what a dense copy would have been
    pulled_bytes: int = 0  # bytes the engines pulled to load this step's weights
    load_kind: str | None = None  # switch, sync, or None (the engines had the weights)
    stale_responses: int = 0  # responses whose weight version was not the one loaded

    @property
    def step_s(self) -> float:
        return self.end_s - self.start_s


def write_records(path: Path, records: Sequence[StepRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in records:
            f.write(json.dumps(asdict(r) | {"step_s": r.step_s}) + "\n")


def summarize(records: Sequence[StepRecord], *, wall_s: float, label: str) -> dict[str, Any]:
    """Per job: the first step's mean reward, the last five's, the margin between them, the
    mean seconds of each phase; and the run's wall time."""
    jobs: dict[str, Any] = {}
    for job in sorted({r.job for r in records}):
        mine = sorted((r for r in records if r.job == job), key=lambda r: r.step)
        last = mine[-5:]
        first = mine[0].reward_mean
        final = statistics.fmean(r.reward_mean for r in last)
        jobs[job] = {
            "task": mine[0].task,
            "steps": len(mine),
            "reward_first": first,
            "reward_last5": final,
            "margin": final - first,
            "phase_s": {p: statistics.fmean(r.phase_s.get(p, 0.0) for r in mine) for p in PHASES},
            "step_s": statistics.fmean(r.step_s for r in mine),
            "sync_bytes": statistics.fmean(r.sync_bytes for r in mine),
            "sync_dense_bytes": mine[0].sync_dense_bytes,
            "logprob_diff_max": max((r.logprob_diff_max or 0.0) for r in mine),
            "stale_responses": sum(r.stale_responses for r in mine),
        }
    return {"label": label, "wall_s": wall_s, "jobs": jobs}


def plot(records: Sequence[StepRecord], out: Path, *, title: str) -> list[Path]:
    """`reward.png` (mean reward per step, per job) and `phases.png` (each phase's mean
    seconds per step, per job)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    jobs = sorted({r.job for r in records})
    fig, ax = plt.subplots(figsize=(6, 4))
    for job in jobs:
        mine = sorted((r for r in records if r.job == job), key=lambda r: r.step)
        task = mine[0].task if mine else ""
        ax.plot([r.step for r in mine], [r.reward_mean for r in mine], label=f"{job} ({task})")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    reward = out / "reward.png"
    fig.savefig(reward, dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    bottom = [0.0] * len(jobs)
    for phase in PHASES:
        means = []
        for job in jobs:
            secs = [r.phase_s.get(phase, 0.0) for r in records if r.job == job]
            means.append(statistics.fmean(secs) if secs else 0.0)
        ax.bar(jobs, means, bottom=bottom, label=phase)
        bottom = [b + m for b, m in zip(bottom, means, strict=True)]
    ax.set_ylabel("seconds per step")
    ax.set_title(f"{title}: time of each phase")
    ax.legend()
    fig.tight_layout()
    phases = out / "phases.png"
    fig.savefig(phases, dpi=120)
    plt.close(fig)
    return [reward, phases]
