"""PlexRL's RLVR jobs (§6.1, Tables 1 and 2) and the cost of moving their state, from
`data/plexrl.toml`.

A job trains on its training deployment (DP x CP x PP x TP GPUs) and rolls out on its own
rollout GPUs (DP_R x TP_R). Each step runs compute_log_prob, update_actor and sync_weight on
the training deployment (Table 2); the rollout is what sets the cycle (Table 2's cycles are ~5x
the training operations), so a job's rollout takes its cycle.

A context switch on a training node group (§4.4, Eq. 3) offloads the resident job's state and
loads the next one's. The state a rank holds under ZeRO-2 (§6.1): bf16 weights (whole on every
rank of a replica, split by PP and TP, expert weights also by EP) and the fp32 optimizer (12
bytes a parameter) sharded over every rank; with ZeRO-offload (235B) the optimizer lives in host
memory and never moves. PlexRL's StateManager copies through pinned host memory (§5.3) at the
measured pinned bandwidth.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from loom.cluster.params import SwitchCost
from loom.core.errors import ConfigError
from loom.perf.specs import ModelSpec, model_spec

if TYPE_CHECKING:
    from loom.sim.cluster.plexrl_trace import TraceJob

__all__ = [
    "TRAIN_OPS",
    "PlexJob",
    "StateCosts",
    "job_trace",
    "plexrl_job",
    "plexrl_jobs",
    "state_costs",
]

TRAIN_OPS = ("compute_log_prob", "update_actor", "sync_weight")


@cache
def _data() -> dict[str, Any]:
    ref = resources.files("loom.sim.workloads").joinpath("data").joinpath("plexrl.toml")
    with ref.open("rb") as f:
        return tomllib.load(f)


def _values(table: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v["value"] if isinstance(v, dict) else v) for k, v in table.items()}


@dataclass(frozen=True, kw_only=True)
class PlexJob:
    """One of §6's jobs."""

    key: str  # "7b", "30b", "235b"
    model: str
    dp: int
    cp: int
    ep: int
    pp: int
    tp: int
    dp_r: int
    tp_r: int
    cycle_s: float
    compute_log_prob_s: float
    update_actor_s: float
    sync_weight_s: float
    bubble_ratio: float  # Table 2, as printed
    zero_offload: bool
    gpu_hours_saving_vs_split_async: float  # Fig. 7b, as printed

    @property
    def train_gpus(self) -> int:
        return self.dp * self.cp * self.pp * self.tp

    @property
    def rollout_gpus(self) -> int:
        return self.dp_r * self.tp_r

    @property
    def train_ops(self) -> tuple[tuple[str, float], ...]:
        return tuple((name, float(getattr(self, f"{name}_s"))) for name in TRAIN_OPS)

    @property
    def train_s(self) -> float:
        return sum(d for _, d in self.train_ops)

    @property
    def rollout_s(self) -> float:
        """The rollout sets the cycle (Table 2: the training operations take 19-29% of it)."""
        return self.cycle_s

    @property
    def spec(self) -> ModelSpec:
        return model_spec(self.model)


def plexrl_job(key: str) -> PlexJob:
    jobs = _data()["jobs"]
    if key not in jobs:
        raise ConfigError(f"unknown PlexRL job {key!r}; known: {', '.join(jobs)}")
    return PlexJob(key=key, **_values(jobs[key]))


def plexrl_jobs() -> list[PlexJob]:
    return [plexrl_job(k) for k in _data()["jobs"]]


@dataclass(frozen=True, kw_only=True)
class StateCosts:
    """Bytes a training rank holds and the bandwidths that move them."""

    weight_bytes_per_param: float
    optimizer_bytes_per_param: float
    pinned_h2d_gbs: float
    pinned_d2h_gbs: float
    pageable_h2d_gbs: float
    pageable_d2h_gbs: float
    colocated_optimizer_load_s: float

    def rank_bytes(self, job: PlexJob) -> tuple[float, float]:
        """(weight bytes, optimizer bytes) on one training rank of `job` that a switch moves
        (the optimizer is 0 under ZeRO-offload: it stays in host memory)."""
        m = job.spec
        total = m.params_b * 1e9
        expert = 0.0
        if m.is_moe:
            expert = m.num_layers * m.num_experts * 3 * m.hidden_size * m.moe_intermediate_size
            expert = min(expert, total)
        per_rank_params = ((total - expert) + expert / job.ep) / (job.pp * job.tp)
        weights = per_rank_params * self.weight_bytes_per_param
        optimizer = (
            0.0 if job.zero_offload else total * self.optimizer_bytes_per_param / job.train_gpus
        )
        return weights, optimizer

    def load_s(self, job: PlexJob) -> float:
        """Bring `job`'s state onto its ranks from pinned host memory (ranks copy in parallel)."""
        return sum(self.rank_bytes(job)) / (self.pinned_h2d_gbs * 1e9)

    def switch_cost(self, job: PlexJob) -> SwitchCost:
        """The switch-cost model RollMux's simulator charges (`SwitchCost`: a phase's state onto
        its GPUs warm, from host memory, or cold), here from `job`'s bytes at the measured
        rates: warm from pinned host memory, cold from pageable."""
        return SwitchCost(
            warm_s=self.load_s(job),
            cold_s=sum(self.rank_bytes(job)) / (self.pageable_h2d_gbs * 1e9),
        )

    def offload_s(self, job: PlexJob) -> float:
        return sum(self.rank_bytes(job)) / (self.pinned_d2h_gbs * 1e9)

    def colocated_switch_s(self, job: PlexJob) -> float:
        """A colocated job's two mode switches per step (§6.2): before training its rollout
        engine's weights go to host memory and the optimizer comes in; after it, back. The
        optimizer moves at the rate §6.2's 19.0 s for the 30B job implies (its per-rank bytes
        over 19.0 s: the framework's own offload path, not a pinned copy), the weights at the
        measured pageable rates."""
        anchor = plexrl_job("30b")
        rate = self.rank_bytes(anchor)[1] / self.colocated_optimizer_load_s
        weights, optimizer = self.rank_bytes(job)
        return (
            2 * optimizer / rate
            + weights / (self.pageable_d2h_gbs * 1e9)
            + weights / (self.pageable_h2d_gbs * 1e9)
        )


def state_costs() -> StateCosts:
    return StateCosts(**_values(_data()["state"]))


def job_trace(
    seed: int,
    *,
    jobs: int,
    groups: int,
    load: float,
    steps: tuple[int, int] = (20, 100),
    jitter: float = 0.15,
) -> list[TraceJob]:
    """A synthetic trace of RL jobs for Fig. 8 (§6.3 replays three months of its cluster's jobs,
    which are not public). Each job takes one of the three jobs' shapes (Table 2's operations,
    rounded to seconds, as the segments of its cycle), its cycle jittered by ±`jitter`, and a
    number of steps uniform in `steps`; one node group each. Arrivals are Poisson at the rate
    that offers `load` times what `groups` groups hold when each job has a group to itself."""
    from loom.cluster.plexrl.timeline import Footprint
    from loom.core.rng import stream
    from loom.sim.cluster.plexrl_trace import TraceJob

    if jobs < 1 or groups < 1 or not load > 0:
        raise ConfigError("need >= 1 job, >= 1 group and load > 0")
    rng = stream(seed, "plexrl-trace")
    shapes = plexrl_jobs()
    mean_duration = sum(j.cycle_s for j in shapes) / len(shapes) * (steps[0] + steps[1]) / 2
    gap = mean_duration / (load * groups)
    out: list[TraceJob] = []
    t = 0.0
    for i in range(jobs):
        shape = shapes[int(rng.integers(0, len(shapes)))]
        period = round(float(shape.cycle_s * rng.uniform(1 - jitter, 1 + jitter)))
        segs, at = [], 0
        for _, d in shape.train_ops:
            segs.append((at, max(1, round(d))))
            at += max(1, round(d))
        out.append(
            TraceJob(
                job_id=f"job{i:04d}",
                arrival_s=int(t),
                footprint=Footprint(tuple(segs), period=period),
                steps=int(rng.integers(steps[0], steps[1] + 1)),
            )
        )
        t += float(rng.exponential(gap))
    return out
