"""ROSE's workloads (seed 002, §2.2, §6, App. B) as data and seeded generators: multi-turn
FrozenLake (Qwen3-8B) and ALFWorld (Qwen3-32B) trajectories, DAPO's redundant sampling, the
spot-GPU trace of RLBoost+ and the serverless lease of λRL.

Every number lives in `data/rose.toml` with its source. A step's batch is `batch / group`
groups; a group shares an environment seed (its prompt and latent difficulty) and each sample
draws a factor around it that sets its number of environment steps and its reasoning tokens
per step (plus an independent "wander" factor on the steps). Every turn re-sends the whole
context, so prefill grows quadratically with the steps (§2.2: 77% / 86% of tokens are prefill;
`prefill_share`). Draws are keyed by (seed, step, group), so the first k groups of a step do
not depend on how many more are launched (DAPO launches extra groups).
"""

from __future__ import annotations

import itertools
import math
import tomllib
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import numpy as np
from scipy.special import betaln

from loom.core.errors import ConfigError
from loom.core.rng import stream
from loom.core.topology import GpuType
from loom.core.trajectory import TrajectorySpec, TurnSpec
from loom.perf.specs import gpu_spec, model_spec
from loom.rollout.policy import WorkerLayout
from loom.sim.rollout.simulator import RolloutConfig

__all__ = [
    "ROSE_WORKLOADS",
    "Algorithm",
    "DapoModel",
    "ProvisioningTime",
    "RoseTask",
    "RoseWorkload",
    "ServerlessLease",
    "SpotTrace",
    "TaskProfile",
    "dapo_groups_to_launch",
    "dapo_valid",
    "group_validity_prob",
    "prefill_share",
    "prefill_tokens",
    "serverless_lease",
    "spot_trace",
    "train_time_s",
    "train_tokens",
]


_E = TypeVar("_E", bound=StrEnum)


class RoseTask(StrEnum):
    FROZENLAKE = "frozenlake"
    ALFWORLD = "alfworld"


class Algorithm(StrEnum):
    GRPO = "grpo"
    DAPO = "dapo"


# ---- data file ------------------------------------------------------------------------------
@cache
def _data() -> dict[str, Any]:
    ref = resources.files("loom.sim.workloads").joinpath("data").joinpath("rose.toml")
    with ref.open("rb") as f:
        return tomllib.load(f)


def _values(table: Mapping[str, Any]) -> dict[str, Any]:
    """The `{ value, source }` entries of a table as plain values (sub-tables left out)."""
    out = {}
    for key, entry in table.items():
        if isinstance(entry, dict) and "value" in entry:
            out[key] = entry["value"]
        elif not isinstance(entry, dict):
            out[key] = entry
    return out


def _section(*path: str) -> dict[str, Any]:
    table: Any = _data()
    for key in path:
        if key not in table:
            raise ConfigError(f"rose.toml has no table {'.'.join(path)!r}")
        table = table[key]
    return _values(table)


def _key(model: str) -> str:
    key = str(model).lower()
    if key not in _data()["workloads"]:
        known = ", ".join(sorted(_data()["workloads"]))
        raise ConfigError(f"unknown ROSE workload {model!r}; known: {known}")
    return key


# ---- token accounting -----------------------------------------------------------------------
def prefill_tokens(traj: TrajectorySpec) -> int:
    """Tokens a trajectory's turns send as input when each turn re-sends its whole context:
    Σ over turns of the context before that turn's output (prompt, earlier outputs, earlier and
    current observations). Prefix caching only changes how much of it is recomputed."""
    context = total = 0
    for turn in traj.turns:
        context += turn.input_tokens
        total += context
        context += turn.output_tokens
    return total


def prefill_share(trajs: Iterable[TrajectorySpec]) -> float:
    """§2.2's prefill share: Σ prefill tokens / Σ (prefill + output tokens) over a batch."""
    prefill = output = 0
    for t in trajs:
        prefill += prefill_tokens(t)
        output += t.output_tokens
    if prefill + output == 0:
        raise ConfigError("prefill_share needs at least one trajectory")
    return prefill / (prefill + output)


def train_tokens(trajs: Iterable[TrajectorySpec]) -> int:
    """Tokens the trainer runs through: each trajectory's final context once (prompt, outputs and
    observations, as one packed sequence)."""
    return sum(t.total_tokens for t in trajs)


# ---- trajectory shapes ----------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class TaskProfile:
    """Shape parameters of one task (medians; spreads are lognormal sigmas); see rose.toml."""

    prompt_tokens: float
    prompt_sigma: float
    obs_tokens: float
    obs_sigma: float
    max_turns: int
    mean_turns: float  # mean number of turns of a sample with factor 1
    turn_exponent: float
    turn_sigma: float  # wandering independent of the factor (long, terse episodes)
    output_tokens: float  # median reasoning tokens per turn at factor 1
    output_exponent: float
    output_sigma: float
    difficulty_sigma: float  # between groups
    sample_sigma: float  # within a group
    env_latency_s: float  # mean environment step, K8S round trip included
    env_latency_sigma: float

    def __post_init__(self) -> None:
        if self.max_turns < 1 or not self.mean_turns >= 1:
            raise ConfigError("a task needs max_turns >= 1 and mean_turns >= 1")
        positive = ("prompt_tokens", "obs_tokens", "output_tokens", "env_latency_s")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        spreads = [n for n in self.__dataclass_fields__ if n.endswith(("_sigma", "_exponent"))]
        for name in spreads:
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")


@cache
def _profile(task: RoseTask) -> TaskProfile:
    return TaskProfile(**_section("tasks", task.value))


# ---- DAPO -----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class DapoModel:
    """Which groups DAPO keeps (§2.2, Fig. 1d): a group is valid when its `group` rewards are
    not all equal. Group success rates are Beta(μκ, (1−μ)κ), so a group is valid with
    probability 1 − E[p^G] − E[(1−p)^G]; μ moves logit-linearly from `mu_start` to `mu_end`
    over `steps`, with seeded per-step jitter on the logit."""

    group: int
    steps: int
    mu_start: float
    mu_end: float
    kappa: float
    logit_jitter: float
    max_launch_multiple: float

    def __post_init__(self) -> None:
        if self.group < 2 or self.steps < 1:
            raise ConfigError("DAPO needs group >= 2 and steps >= 1")
        if not (0 < self.mu_start < 1 and 0 < self.mu_end < 1 and self.kappa > 0):
            raise ConfigError("DAPO needs 0 < mu_start, mu_end < 1 and kappa > 0")
        if not self.max_launch_multiple >= 1:
            raise ConfigError(f"max_launch_multiple must be >= 1, got {self.max_launch_multiple}")

    def mean_success(self, step: int, seed: int = 0) -> float:
        _check_step(step)
        progress = min(step / max(self.steps - 1, 1), 1.0)
        lo, hi = _logit(self.mu_start), _logit(self.mu_end)
        jitter = stream(seed, f"rose/dapo/jitter/{step}").normal(0.0, self.logit_jitter)
        return _expit(lo + (hi - lo) * progress + jitter)

    def validity_prob(self, step: int, seed: int = 0) -> float:
        """P(a group at `step` has rewards of non-zero variance)."""
        mu = self.mean_success(step, seed)
        a, b, g = mu * self.kappa, (1 - mu) * self.kappa, self.group
        base = betaln(a, b)
        all_one = math.exp(betaln(a + g, b) - base)
        all_zero = math.exp(betaln(a, b + g) - base)
        return max(0.0, 1.0 - all_one - all_zero)

    def valid(self, step: int, group_ids: Sequence[int] | np.ndarray, seed: int = 0) -> np.ndarray:
        """Boolean mask: which of `group_ids` (a step's groups, numbered from 0) are valid."""
        ids = np.asarray(group_ids, dtype=np.int64)
        if ids.size == 0:
            return np.zeros(0, dtype=bool)
        if ids.min() < 0:
            raise ConfigError("group ids must be >= 0")
        q = self.validity_prob(step, seed)
        draws = stream(seed, f"rose/dapo/valid/{step}").random(int(ids.max()) + 1)
        return draws[ids] < q

    def max_groups(self, target_groups: int) -> int:
        """The most groups one step may launch: `max_launch_multiple` × the target."""
        return max(target_groups, math.floor(self.max_launch_multiple * target_groups))

    def groups_to_launch(self, step: int, target_groups: int, seed: int = 0) -> int:
        """Groups launched, in id order, until `target_groups` valid ones are collected; capped
        at `max_groups` (the step then trains on fewer valid groups)."""
        if target_groups < 1:
            raise ConfigError(f"target_groups must be >= 1, got {target_groups}")
        cap = self.max_groups(target_groups)
        count = np.cumsum(self.valid(step, np.arange(cap), seed))
        reached = np.flatnonzero(count >= target_groups)
        return int(reached[0]) + 1 if reached.size else cap


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _expit(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _enum(kind: type[_E], value: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        known = ", ".join(k.value for k in kind)
        raise ConfigError(f"unknown {kind.__name__} {value!r}; known: {known}") from None


def _check_step(step: int) -> None:
    if step < 0:
        raise ConfigError(f"step must be >= 0, got {step}")


# ---- the workload ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RoseWorkload:
    """One of §6's two jobs: its task, cluster split, serving neighbour and SLOs, and a seeded
    generator of each step's trajectories."""

    task: RoseTask
    model: str  # rollout/training model, a key of perf/data/models.toml
    serving_model: str  # the co-located serving model (§6)
    batch: int  # trajectories per step (see rose.toml: ROLL's rollout_batch_size)
    group: int  # samples per group (GRPO/DAPO group size)
    rollout_gpus: int
    train_gpus: int
    rollout_tp: int
    max_lent_gpus: int  # cap on borrowed serving GPUs
    slo_ttft_s: float  # serving P99 TTFT SLO
    slo_tpot_s: float  # serving P99 TPOT SLO
    steps: Mapping[Algorithm, int] = field(hash=False)  # training steps per algorithm
    train_parallel: tuple[int, int, int] = (1, 1, 1)  # (TP, PP, CP)
    max_running_per_gpu: int = 16  # App. A
    max_response_tokens: int = 32_768
    gpu: GpuType = GpuType.H800
    seed: int = 0

    def __post_init__(self) -> None:
        if self.group < 1 or self.batch < self.group or self.batch % self.group:
            raise ConfigError(
                f"batch ({self.batch}) must be a positive multiple of group ({self.group})"
            )
        if self.rollout_tp < 1 or self.rollout_gpus % self.rollout_tp:
            raise ConfigError(
                f"rollout_gpus ({self.rollout_gpus}) must be a multiple of rollout_tp "
                f"({self.rollout_tp})"
            )
        if min(self.train_gpus, self.max_running_per_gpu, self.max_response_tokens) < 1:
            raise ConfigError("train_gpus, max_running_per_gpu, max_response_tokens must be >= 1")
        if self.max_lent_gpus < 0:
            raise ConfigError(f"max_lent_gpus must be >= 0, got {self.max_lent_gpus}")
        if not (self.slo_ttft_s > 0 and self.slo_tpot_s > 0):
            raise ConfigError("serving SLOs must be > 0 s")
        model_spec(self.model)  # each raises ConfigError on an unknown model
        model_spec(self.serving_model)
        object.__setattr__(self, "task", _enum(RoseTask, self.task))
        steps = {_enum(Algorithm, a): int(n) for a, n in self.steps.items()}
        if set(steps) != set(Algorithm) or min(steps.values()) < 1:
            raise ConfigError(f"steps needs >= 1 step for each of {[a.value for a in Algorithm]}")
        object.__setattr__(self, "steps", MappingProxyType(steps))

    # ---- derived settings ------------------------------------------------------------------
    @property
    def groups(self) -> int:
        """Groups per step (GRPO)."""
        return self.batch // self.group

    @property
    def profile(self) -> TaskProfile:
        return _profile(self.task)

    @property
    def dapo(self) -> DapoModel:
        return DapoModel(group=self.group, steps=self.steps[Algorithm.DAPO], **_section("dapo"))

    def layout(self) -> WorkerLayout:
        """The dedicated rollout workers: rollout_gpus / rollout_tp workers of rollout_tp."""
        return WorkerLayout(degrees=(self.rollout_tp,) * (self.rollout_gpus // self.rollout_tp))

    def rollout_config(self) -> RolloutConfig:
        """Simulator settings of the dedicated rollout workers (16 running turns per GPU)."""
        return RolloutConfig(
            model=self.model, gpu=self.gpu, max_running=self.max_running_per_gpu * self.rollout_tp
        )

    # ---- DAPO ------------------------------------------------------------------------------
    def dapo_valid(self, step: int, group_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        return self.dapo.valid(step, group_ids, self.seed)

    def dapo_groups(self, step: int) -> int:
        """Groups DAPO launches at `step` to collect `groups` valid ones (capped)."""
        return self.dapo.groups_to_launch(step, self.groups, self.seed)

    # ---- trajectories ----------------------------------------------------------------------
    def sample(self, step: int, n_groups: int | None = None) -> list[TrajectorySpec]:
        """The trajectories of `n_groups` groups (default: the GRPO batch) at `step`, ids
        0..n-1 group by group; `prompt_id` is the group's index within the step."""
        _check_step(step)
        n = self.groups if n_groups is None else n_groups
        if n < 1:
            raise ConfigError(f"n_groups must be >= 1, got {n}")
        out: list[TrajectorySpec] = []
        for g in range(n):
            out.extend(self._group(step, g, first_id=len(out)))
        return out

    def _group(self, step: int, g: int, first_id: int) -> list[TrajectorySpec]:
        p = self.profile
        rng = stream(self.seed, f"rose/{self.task.value}/{step}/{g}")
        difficulty = float(rng.lognormal(0.0, p.difficulty_sigma))
        prompt = max(16, int(p.prompt_tokens * rng.lognormal(0.0, p.prompt_sigma)))
        # What a reader of the environment's initial state could guess of its difficulty.
        observed = difficulty * float(rng.lognormal(0.0, 0.5))
        features = (float(prompt), observed)
        return [
            TrajectorySpec(
                traj_id=first_id + s,
                prompt_id=g,
                sample_idx=s,
                workload=None,
                turns=self._turns(
                    rng, difficulty * float(rng.lognormal(0.0, p.sample_sigma)), prompt
                ),
                prompt_features=features,
            )
            for s in range(self.group)
        ]

    def _turns(self, rng: np.random.Generator, factor: float, prompt: int) -> tuple[TurnSpec, ...]:
        p = self.profile
        wander = rng.lognormal(0.0, p.turn_sigma)
        extra = rng.poisson((p.mean_turns - 1) * factor**p.turn_exponent * wander)
        n = int(min(p.max_turns, 1 + extra))
        median = p.output_tokens * factor**p.output_exponent
        outputs = np.maximum(1, median * rng.lognormal(0.0, p.output_sigma, n)).astype(int)
        obs = np.maximum(1, p.obs_tokens * rng.lognormal(0.0, p.obs_sigma, n)).astype(int)
        lat_mu = math.log(p.env_latency_s) - p.env_latency_sigma**2 / 2  # lognormal with that mean
        latency = rng.lognormal(lat_mu, p.env_latency_sigma, n)
        return _cap_response(outputs, obs, latency, prompt, self.max_response_tokens)


def _cap_response(
    outputs: np.ndarray, obs: np.ndarray, latency: np.ndarray, prompt: int, budget: int
) -> tuple[TurnSpec, ...]:
    """Turns until the response (outputs and observations after the prompt) reaches `budget`
    tokens: the turn that reaches it is cut there and ends the trajectory."""
    turns: list[TurnSpec] = []
    appended = prompt
    for k, out in enumerate(outputs):
        o = min(int(out), budget)
        budget -= o
        last = k == len(outputs) - 1 or budget <= obs[k]
        turns.append(
            TurnSpec(
                input_tokens=appended,
                output_tokens=o,
                tool_latency_s=None if last else float(latency[k]),
            )
        )
        if last:
            break
        budget -= int(obs[k])
        appended = int(obs[k])
    return tuple(turns)


# ---- training time --------------------------------------------------------------------------
def train_time_s(workload: RoseWorkload, tokens: int) -> float:
    """Seconds of one training step over `tokens`: 6·N·tokens FLOPs (forward and backward) on
    `train_gpus` GPUs at the assumed MFU (rose.toml [training])."""
    if tokens < 0:
        raise ConfigError(f"tokens must be >= 0, got {tokens}")
    params = model_spec(workload.model).params_b * 1e9
    peak = gpu_spec(workload.gpu).bf16_tflops * 1e12
    mfu = float(_section("training")["mfu"])
    return 6.0 * params * tokens / (workload.train_gpus * peak * mfu)


# ---- provisioning, spot and serverless ------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ProvisioningTime:
    """Seconds from a GPU becoming available to it serving rollouts, by component."""

    acquire_s: float  # VM or function instance start, container and CUDA init
    model_load_s: float  # weights from storage into GPU memory
    runtime_init_s: float  # engine init: profiling, KV allocation, compile, CUDA graphs
    weight_sync_s: float  # pulling the current policy weights

    def __post_init__(self) -> None:
        for name in ("acquire_s", "model_load_s", "runtime_init_s", "weight_sync_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def total_s(self) -> float:
        return self.acquire_s + self.model_load_s + self.runtime_init_s + self.weight_sync_s


@dataclass(frozen=True, kw_only=True)
class SpotTrace:
    """Available spot GPUs over a window: `steps` is [(t_s, n_gpus)] at each change (t = 0
    first), constant until the next; every t is a multiple of `slot_s`. Spot GPUs only:
    RLBoost+ keeps ROLL's dedicated rollout and training GPUs beside them (§6)."""

    model: str
    max_gpus: int
    instance_gpus: int  # capacity comes and goes in instances of this many GPUs
    horizon_s: float
    slot_s: float
    steps: tuple[tuple[float, int], ...]
    recovery: ProvisioningTime  # per preempted or newly provisioned instance
    warning_s: float  # notice before a preemption

    def __post_init__(self) -> None:
        if not self.steps or self.steps[0][0] != 0:
            raise ConfigError("a spot trace starts at t = 0")
        times = [t for t, _ in self.steps]
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise ConfigError("spot trace times must increase")
        if any(not 0 <= n <= self.max_gpus for _, n in self.steps):
            raise ConfigError(f"spot GPUs must lie in [0, {self.max_gpus}]")

    def at(self, t_s: float) -> int:
        """GPUs available at time `t_s` (the last value holds past the horizon)."""
        if t_s < 0:
            raise ConfigError(f"time must be >= 0, got {t_s}")
        i = bisect_right([t for t, _ in self.steps], t_s) - 1
        return self.steps[i][1]

    def slots(self) -> list[int]:
        """GPUs per `slot_s` slot over the horizon."""
        n = round(self.horizon_s / self.slot_s)
        return [self.at(i * self.slot_s) for i in range(n)]

    @property
    def mean_fraction(self) -> float:
        return float(np.mean(self.slots())) / self.max_gpus

    @property
    def gpus_lost(self) -> int:
        """GPUs preempted over the window (sum of the drops)."""
        return sum(max(0, a - b) for (_, a), (_, b) in itertools.pairwise(self.steps))

    @property
    def gpus_gained(self) -> int:
        """GPUs newly provisioned over the window (sum of the rises)."""
        return sum(max(0, b - a) for (_, a), (_, b) in itertools.pairwise(self.steps))


@dataclass(frozen=True, kw_only=True)
class ServerlessLease:
    """λRL's pool: `gpus` serverless GPUs, all leased for `lease_s` and re-acquired together
    (each acquisition pays `cold_start`; in-flight rollouts on an expiring lease are lost)."""

    gpus: int
    lease_s: float
    cold_start: ProvisioningTime

    def __post_init__(self) -> None:
        if self.gpus < 1 or not self.lease_s > 0:
            raise ConfigError("a serverless pool needs gpus >= 1 and lease_s > 0")

    def expiries(self, horizon_s: float) -> list[float]:
        """Lease expiries inside a window of `horizon_s`: t = lease_s, 2·lease_s, ... < horizon."""
        if horizon_s < 0:
            raise ConfigError(f"horizon must be >= 0 s, got {horizon_s}")
        n = math.ceil(horizon_s / self.lease_s) - 1
        return [k * self.lease_s for k in range(1, max(n, 0) + 1)]


def _provisioning(*path: str) -> ProvisioningTime:
    v = _section(*path)
    return ProvisioningTime(
        acquire_s=v["acquire_s"],
        model_load_s=v["model_load_s"],
        runtime_init_s=v["runtime_init_s"],
        weight_sync_s=v["weight_sync_s"],
    )


def serverless_lease(model: str) -> ServerlessLease:
    """λRL's serverless pool for workload `model` ("8b" or "32b")."""
    key = _key(model)
    return ServerlessLease(
        gpus=int(_section("serverless", key)["gpus"]),
        lease_s=float(_section("serverless")["lease_s"]),
        cold_start=_provisioning("serverless", key),
    )


def spot_trace(model: str, seed: int = 0, *, max_tries: int = 100_000) -> SpotTrace:
    """A volatile 2-hour spot window for workload `model` ("8b" or "32b"), seeded: the
    semi-Markov capacity process of docs/rose-spot-traces.md §4, rejection-sampled until its
    changes, mean, losses and minimum match the most volatile public windows."""
    key = _key(model)
    common, own = _section("spot"), _section("spot", key)
    proc = _SpotProcess(
        max_gpus=int(own["max_gpus"]),
        instance_gpus=int(own["instance_gpus"]),
        changes=int(own["changes"]),
        slots=round(common["horizon_s"] / common["slot_s"]),
        **{k: common[k] for k in _SpotProcess.SHAPE},
    )
    rng = stream(seed, f"rose/spot/{key}")
    for _ in range(max_tries):
        levels = proc.draw(rng)
        if proc.accepts(levels):
            break
    else:
        raise ConfigError(f"no spot trace met the targets in {max_tries} tries (seed {seed})")
    slot = float(common["slot_s"])
    steps = [(0.0, levels[0])] + [
        (i * slot, levels[i]) for i in range(1, len(levels)) if levels[i] != levels[i - 1]
    ]
    return SpotTrace(
        model=key,
        max_gpus=proc.max_gpus,
        instance_gpus=proc.instance_gpus,
        horizon_s=float(common["horizon_s"]),
        slot_s=slot,
        steps=tuple(steps),
        recovery=_provisioning("spot", "recovery", key),
        warning_s=float(common["warning_s"]),
    )


@dataclass(frozen=True, kw_only=True)
class _SpotProcess:
    """docs/rose-spot-traces.md §4: K change points on the slot grid; at each, a drop (always
    from full, else with `p_drop_partial`; a wipe-out with `p_wipe`) or a recovery (to full
    with `p_recover_full`), rounded down to whole instances."""

    SHAPE: ClassVar[tuple[str, ...]] = (
        "p_drop_partial",
        "p_wipe",
        "drop_fraction",
        "p_recover_full",
        "add_fraction",
        "accept_mean",
        "accept_lost",
        "accept_min",
    )

    max_gpus: int
    instance_gpus: int
    changes: int
    slots: int
    p_drop_partial: float
    p_wipe: float
    drop_fraction: tuple[float, float]
    p_recover_full: float
    add_fraction: tuple[float, float]
    accept_mean: tuple[float, float]
    accept_lost: tuple[float, float]
    accept_min: float

    def draw(self, rng: np.random.Generator) -> list[int]:
        points = sorted(rng.choice(np.arange(1, self.slots), size=self.changes, replace=False))
        levels, level = [self.max_gpus] * self.slots, self.max_gpus
        for point in points:
            level = self._next(rng, level)
            levels[point:] = [level] * (self.slots - point)
        return levels

    def _next(self, rng: np.random.Generator, level: int) -> int:
        top = self.max_gpus
        if level == top or (level > 0 and rng.random() < self.p_drop_partial):
            if rng.random() < self.p_wipe:
                return 0
            new = level - math.ceil(rng.uniform(*self.drop_fraction) * top)
        elif rng.random() < self.p_recover_full:
            new = top
        else:
            new = level + math.ceil(rng.uniform(*self.add_fraction) * top)
        new = min(max(new, 0), top)
        return new // self.instance_gpus * self.instance_gpus

    def accepts(self, levels: list[int]) -> bool:
        top = self.max_gpus
        changes = sum(a != b for a, b in itertools.pairwise(levels))
        lost = sum(max(0, a - b) for a, b in itertools.pairwise(levels))
        mean = float(np.mean(levels)) / top
        return (
            changes == self.changes
            and self.accept_mean[0] <= mean <= self.accept_mean[1]
            and self.accept_lost[0] * top <= lost <= self.accept_lost[1] * top
            and min(levels) <= self.accept_min * top
        )


# ---- module-level helpers -------------------------------------------------------------------
def _workload(key: str) -> RoseWorkload:
    v = _section("workloads", key)
    tp, pp, cp = (int(x) for x in v["train_parallel"])
    return RoseWorkload(
        task=RoseTask(v["task"]),
        model=v["model"],
        serving_model=v["serving_model"],
        batch=int(v["batch"]),
        group=int(v["group"]),
        rollout_gpus=int(v["rollout_gpus"]),
        train_gpus=int(v["train_gpus"]),
        rollout_tp=int(v["rollout_tp"]),
        max_lent_gpus=int(v["max_lent_gpus"]),
        slo_ttft_s=float(v["slo_ttft_s"]),
        slo_tpot_s=float(v["slo_tpot_s"]),
        steps={Algorithm.GRPO: int(v["steps_grpo"]), Algorithm.DAPO: int(v["steps_dapo"])},
        train_parallel=(tp, pp, cp),
        max_running_per_gpu=int(v["max_running_per_gpu"]),
        max_response_tokens=int(v["max_response_tokens"]),
    )


ROSE_WORKLOADS: dict[str, RoseWorkload] = {key: _workload(key) for key in ("8b", "32b")}


def group_validity_prob(step: int, workload: str = "8b", seed: int = 0) -> float:
    """P(a DAPO group at `step` is valid) for workload "8b" or "32b"."""
    return ROSE_WORKLOADS[_key(workload)].dapo.validity_prob(step, seed)


def dapo_valid(
    step: int, group_ids: Sequence[int] | np.ndarray, seed: int, workload: str = "8b"
) -> np.ndarray:
    """Which of a step's `group_ids` DAPO keeps (deterministic per seed)."""
    return ROSE_WORKLOADS[_key(workload)].dapo.valid(step, group_ids, seed)


def dapo_groups_to_launch(step: int, seed: int, workload: str = "8b") -> int:
    """Groups launched at `step` until the batch's worth of valid groups is collected."""
    w = ROSE_WORKLOADS[_key(workload)]
    return w.dapo.groups_to_launch(step, w.groups, seed)
