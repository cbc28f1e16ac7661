"""RollMux's sourced numbers (`perf/data/rollmux.toml`) as typed, cached tables."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from loom.core.errors import ConfigError
from loom.core.topology import GpuType
from loom.perf.specs import gpu_spec

__all__ = [
    "Footprint",
    "JobType",
    "NoiseModel",
    "Philly",
    "Profile",
    "Scaling",
    "SwitchCost",
    "Testbed",
    "footprint",
    "job_types",
    "noise_model",
    "philly",
    "production",
    "profiles",
    "scaling",
    "switch_cost",
    "testbed",
]


@cache
def _data() -> dict[str, Any]:
    path = resources.files("loom.perf").joinpath("data").joinpath("rollmux.toml")
    with path.open("rb") as fh:
        return tomllib.load(fh)


def _value(item: Any) -> Any:
    return item["value"] if isinstance(item, dict) and "value" in item else item


def _table(name: str) -> dict[str, Any]:
    table = _data()[name]
    if "source" not in table:
        raise ConfigError(f"rollmux.toml [{name}] has no source")
    return {k: _value(v) for k, v in table.items() if k != "source"}


@dataclass(frozen=True, kw_only=True)
class Testbed:
    """Two pools of 8-GPU nodes joined by a slow link (§7.1); prices per GPU-hour (Table 1)."""

    gpus_per_node: int
    rollout_gpu: GpuType
    training_gpu: GpuType
    rollout_price_h: float
    training_price_h: float
    inter_pool_gbps: float
    intra_pool_gbps: float
    nvlink_gbs: float
    host_memory_gb: float

    @property
    def rollout_node_price_h(self) -> float:
        return self.rollout_price_h * self.gpus_per_node

    @property
    def training_node_price_h(self) -> float:
        return self.training_price_h * self.gpus_per_node

    def cost_per_h(self, rollout_nodes: int, training_nodes: int) -> float:
        """Hourly price of a set of nodes in each pool."""
        return (
            rollout_nodes * self.rollout_node_price_h + training_nodes * self.training_node_price_h
        )


@cache
def testbed(host_memory_gb: float | None = None) -> Testbed:
    """The seed's testbed: H20 rollout pool, H800 training pool."""
    t = _table("testbed")
    rollout, training = gpu_spec(GpuType.H20), gpu_spec(GpuType.H800)
    assert rollout.price_per_h is not None and training.price_per_h is not None
    return Testbed(
        gpus_per_node=int(t["gpus_per_node"]),
        rollout_gpu=GpuType.H20,
        training_gpu=GpuType.H800,
        rollout_price_h=rollout.price_per_h,
        training_price_h=training.price_per_h,
        inter_pool_gbps=float(t["inter_pool_gbps"]),
        intra_pool_gbps=float(t["intra_pool_gbps"]),
        nvlink_gbs=float(t["nvlink_gbs"]),
        host_memory_gb=float(host_memory_gb or t["host_memory_gb"]),
    )


@dataclass(frozen=True, kw_only=True)
class Footprint:
    """Host memory (GB) per 8-GPU node to keep a job's actor warm (Table 2)."""

    rollout_gb: float
    train_gb: float
    rollout_tp: int = 1  # GPUs per rollout replica


def footprint(size: str) -> Footprint:
    table = _table("footprint")
    if size not in table:
        raise ConfigError(f"no Table 2 footprint for model size {size!r}; known: {list(table)}")
    return Footprint(**table[size])


@dataclass(frozen=True, kw_only=True)
class SwitchCost:
    """Seconds to bring one phase's state onto an 8-GPU node (Fig. 4)."""

    cold_s: float
    warm_s: float


def switch_cost(size: str) -> SwitchCost:
    table = _table("switch")
    if size not in table:
        raise ConfigError(f"no Fig. 4 switch cost for model size {size!r}; known: {list(table)}")
    return SwitchCost(**table[size])


@dataclass(frozen=True, kw_only=True)
class NoiseModel:
    """How actual phase times fall below the worst case, per iteration (long-tailed rollouts)."""

    rollout_max_frac_lo: float
    hit_max_prob: float
    train_frac_lo: float
    train_frac_hi: float
    tail_start_frac: float
    tail_gpu_frac: float
    migration_s: float


@cache
def noise_model() -> NoiseModel:
    return NoiseModel(**_table("stochastic"))


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A Table 6 job configuration: uniform ranges of worst-case phase times (s)."""

    name: str
    roll: tuple[float, float]
    train: tuple[float, float]
    size: str
    gpus: int

    @property
    def kind(self) -> str:
        return self.name.split("-")[0]


@cache
def profiles() -> dict[str, Profile]:
    return {
        name: Profile(
            name=name,
            roll=(float(v["roll"][0]), float(v["roll"][1])),
            train=(float(v["train"][0]), float(v["train"][1])),
            size=str(v["model"]),
            gpus=int(v["gpus"]),
        )
        for name, v in _table("profiles").items()
    }


@dataclass(frozen=True, kw_only=True)
class JobType:
    """A Table 3 micro-benchmark job."""

    name: str
    turns: str
    model: str
    size: str
    max_len: int
    batch: int
    n_t: int
    n_r: int
    roll_s: float
    train_s: float


@cache
def job_types() -> dict[str, JobType]:
    return {name: JobType(name=name, **v) for name, v in _table("job_types").items()}


@dataclass(frozen=True, kw_only=True)
class Philly:
    """Shape of a job trace: the Philly segment of §7.5, or §7.4's production trace."""

    jobs: int
    span_h: float
    mean_duration_h: float
    max_duration_h: float


@dataclass(frozen=True, kw_only=True)
class Scaling:
    """Rollout time on k times a job's rollout nodes: serial + (1 - serial) / k of the original."""

    rollout_serial_frac: float
    gavel_max_rollout_factor: int

    def rollout_time_s(self, roll_s: float, factor: float) -> float:
        return roll_s * (self.rollout_serial_frac + (1 - self.rollout_serial_frac) / factor)


@cache
def scaling() -> Scaling:
    return Scaling(**_table("scaling"))


@cache
def philly() -> Philly:
    return Philly(**_table("philly"))


@cache
def production() -> Philly:
    """§7.4's two-week production trace."""
    return Philly(**_table("production"))
