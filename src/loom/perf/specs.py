"""Sourced GPU and model specs and roofline efficiency factors, read from `perf/data/*.toml`."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from loom.core.errors import ConfigError
from loom.core.topology import GpuType

__all__ = [
    "Calibration",
    "GpuSpec",
    "ModelSpec",
    "gpu_spec",
    "list_gpus",
    "list_models",
    "load_calibration",
    "model_spec",
]

BF16_BYTES = 2


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One GPU's datasheet numbers; `sources` maps each field name to where its value comes from."""

    gpu: GpuType
    bf16_tflops: float  # dense, no sparsity
    hbm_gb: float
    hbm_bw_tbs: float
    nvlink_gbs: float  # per direction per GPU
    network_gbs: float  # scale-out NIC per GPU
    price_per_h: float | None = None  # USD per GPU-hour
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder's shape as in its `config.json` (dense, or a mixture of experts); `sources` as
    in `GpuSpec`."""

    name: str
    params_b: float
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    # mixture of experts (0 / None for a dense model)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    active_params_b: float | None = None  # parameters a token passes through
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def weight_bytes(self) -> float:
        """Bytes of the bf16 weights."""
        return self.params_b * 1e9 * BF16_BYTES

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of bf16 K and V cached per token over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * BF16_BYTES

    @property
    def flops_per_token(self) -> float:
        """FLOPs of the linear layers per token (≈ 2 · parameters it passes through: the active
        ones of a mixture of experts), attention excluded."""
        return 2.0 * (self.active_params_b or self.params_b) * 1e9

    @property
    def attn_flops_per_pair(self) -> int:
        """FLOPs per (query token, attended token) pair: QKᵀ and PV over all layers and heads."""
        return 4 * self.num_layers * self.num_heads * self.head_dim


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Achieved fractions of peak and fixed costs that turn a roofline into a latency estimate."""

    prefill_mfu: float  # of peak bf16 FLOPS, prefill tokens
    decode_mfu: float  # of peak bf16 FLOPS, decode tokens
    decode_mbu: float  # of HBM bandwidth, all HBM traffic
    allreduce_efficiency: float  # of NVLink bandwidth, ring all-reduce
    allreduce_latency_s: float  # fixed cost of one all-reduce
    iteration_overhead_s: float  # CPU scheduling and launch per engine iteration
    memory_fraction: float = 0.9  # of HBM for weights plus KV cache
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        fractions = ("prefill_mfu", "decode_mfu", "decode_mbu", "allreduce_efficiency")
        for name in (*fractions, "memory_fraction"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"calibration {name} must be in (0, 1], got {value}")
        if self.allreduce_latency_s < 0 or self.iteration_overhead_s < 0:
            raise ConfigError("calibration latencies must be >= 0 s")


def _load(filename: str) -> dict[str, Any]:
    with resources.files("loom.perf").joinpath("data").joinpath(filename).open("rb") as f:
        return tomllib.load(f)


def _split(table: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Values and per-field sources of a table whose numbers are bare or `{ value, source }`."""
    default = table.get("source")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, item in table.items():
        if key == "source":
            continue
        if isinstance(item, dict):
            values[key], sources[key] = item["value"], item["source"]
        elif default is None:
            raise ConfigError(f"{where}: {key!r} has no source")
        else:
            values[key], sources[key] = item, default
    return values, sources


def _unknown(kind: str, name: object, known: list[str]) -> ConfigError:
    return ConfigError(f"unknown {kind} {name!r}; known: {', '.join(known)}")


@cache
def _gpu_specs() -> dict[GpuType, GpuSpec]:
    specs = {}
    for key, table in _load("gpus.toml").items():
        values, sources = _split(table, f"gpus.toml [{key}]")
        specs[GpuType(key)] = GpuSpec(gpu=GpuType(key), sources=sources, **values)
    return specs


@cache
def _model_specs() -> dict[str, ModelSpec]:
    specs = {}
    for key, table in _load("models.toml").items():
        values, sources = _split(table, f"models.toml [{key}]")
        specs[key] = ModelSpec(name=key, sources=sources, **values)
    return specs


def list_gpus() -> list[GpuType]:
    """GPU types with a spec row."""
    return list(_gpu_specs())


def list_models() -> list[str]:
    """Model keys with a spec row, e.g. `qwen3-8b`."""
    return list(_model_specs())


def gpu_spec(gpu: GpuType | str) -> GpuSpec:
    """Spec of `gpu` (a `GpuType` or its value, case-insensitive)."""
    specs = _gpu_specs()
    try:
        return specs[GpuType(str(gpu).lower())]
    except (ValueError, KeyError):
        raise _unknown("GPU type", gpu, [str(g) for g in specs]) from None


def model_spec(name: str) -> ModelSpec:
    """Spec of model `name`: a key such as `qwen3-8b`, or its Hugging Face id `Qwen/Qwen3-8B`."""
    specs = _model_specs()
    key = name.lower().removeprefix("qwen/")
    if key not in specs:
        raise _unknown("model", name, list(specs))
    return specs[key]


@cache
def load_calibration(name: str = "default") -> Calibration:
    """The named table of `calibration.toml`."""
    tables = _load("calibration.toml")
    if name not in tables:
        raise _unknown("calibration", name, list(tables))
    values, sources = _split(tables[name], f"calibration.toml [{name}]")
    return Calibration(sources=sources, **values)
