"""What an emulated GPU engine emulates: `MODEL@GPU[:tpN]` and the engine's settings."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from loom.core.errors import ConfigError
from loom.core.topology import GpuType
from loom.perf.latency import RooflineLatencyModel
from loom.perf.specs import gpu_spec, model_spec
from loom.perf.transfer import KvLinks
from loom.rollout.engine_queue import EngineSchedulingPolicy
from loom.rollout.rose.admission import AdmissionKind, Role
from loom.sim.rollout.simulator import RolloutConfig

__all__ = ["CoServeSettings", "EmulatedEngineConfig", "EmulationSpec"]

_SPEC = re.compile(r"^(?P<model>[^@\s]+)@(?P<gpu>[A-Za-z0-9]+)(?::tp(?P<tp>\d+))?$")
_SIM = RolloutConfig()  # the simulator's engine settings are the emulator's defaults


@dataclass(frozen=True, kw_only=True)
class EmulationSpec:
    """A model on a GPU type at a tensor-parallel degree: `qwen3-14b@h100:tp2`."""

    model: str
    gpu: GpuType
    tp: int = 1

    def __post_init__(self) -> None:
        model_spec(self.model)  # raises ConfigError naming the known models
        RooflineLatencyModel(self.gpu, self.model, tp=self.tp)  # checks tp against the heads

    @classmethod
    def parse(cls, text: str) -> EmulationSpec:
        match = _SPEC.match(text.strip())
        if match is None:
            raise ConfigError(
                f"cannot read {text!r} as MODEL@GPU[:tpN] (for example qwen3-14b@h100:tp2)"
            )
        gpu = gpu_spec(match["gpu"]).gpu  # raises ConfigError naming the known GPUs
        return cls(model=match["model"].lower(), gpu=gpu, tp=int(match["tp"] or 1))

    def __str__(self) -> str:
        return f"{self.model}@{self.gpu.value}:tp{self.tp}"


@dataclass(frozen=True, kw_only=True)
class CoServeSettings:
    """What a lent instance serves beside the rollout, and how it shares the GPU."""

    serving_model: str = field(metadata={"help": "the serving model (a `loom.perf` model key)"})
    role: Role = field(default=Role.DECODE, metadata={"help": "prefill or decode (PD roles)"})
    ttft_s: float = field(default=0.5, metadata={"help": "B_TTFT, the serving SLO (§6: 7B)"})
    tpot_s: float = field(default=0.15, metadata={"help": "B_TPOT, the serving SLO (§6: 7B)"})
    admission: AdmissionKind = field(
        default=AdmissionKind.DUAL_SLO, metadata={"help": "which SLOs rollout admission keeps"}
    )
    lease_s: float = field(
        default=10.0, metadata={"help": "seconds a rollout prefix is kept (ROSE's system: 10)"}
    )
    max_running_per_gpu: int = field(
        default=16, metadata={"help": "rollout requests per GPU (§4.3's cap for Qwen3 at 32K)"}
    )

    def __post_init__(self) -> None:
        model_spec(self.serving_model)  # raises ConfigError naming the known models
        try:
            object.__setattr__(self, "role", Role(self.role))
            object.__setattr__(self, "admission", AdmissionKind(self.admission))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.role == Role.COLOCATED:
            raise ConfigError("a co-serving engine is a prefiller or a decoder (PD roles)")
        if self.lease_s < 0 or self.max_running_per_gpu < 1:
            raise ConfigError("lease_s must be >= 0 and max_running_per_gpu >= 1")


@dataclass(frozen=True, kw_only=True)
class EmulatedEngineConfig:
    """An emulated engine: the simulator's worker model of `spec`, on a scaled wall clock."""

    spec: EmulationSpec
    time_scale: float = field(
        default=1.0,
        metadata={
            "help": "wall seconds per emulated GPU second: 0.1 runs ten times faster than the "
            "GPU would"
        },
    )
    scheduling_policy: EngineSchedulingPolicy = field(
        default=EngineSchedulingPolicy.PRIORITY,
        metadata={"help": "vLLM's --scheduling-policy: fcfs, or priority (lower first)"},
    )
    max_running: int = field(
        default=_SIM.max_running, metadata={"help": "most requests running at once"}
    )
    chunk_tokens: int = field(
        default=_SIM.chunk_tokens, metadata={"help": "chunked-prefill tokens per iteration"}
    )
    decode_reserve: int = field(
        default=_SIM.decode_reserve,
        metadata={"help": "KV tokens reserved per running request at admission"},
    )
    max_model_len: int | None = field(
        default=None,
        metadata={"help": "longest prompt + output accepted; None: the KV capacity"},
    )
    served_model_name: str | None = field(
        default=None, metadata={"help": "the model's name in /v1/models; None: the model key"}
    )
    node: int = field(
        default=0,
        metadata={
            "help": "node its GPUs sit on: KV moves to engines of the same node go over "
            "NVLink, others over the network"
        },
    )
    inter_node_gbs: float = field(
        default=_SIM.inter_node_gbs, metadata={"help": "GB/s of KV moves between nodes"}
    )
    coserve: CoServeSettings | None = field(
        default=None,
        metadata={
            "help": "a lent serving GPU (ROSE): serve this model's requests beside the "
            "rollout's (`loom.runtime.emulate.coserve`); None: a rollout engine"
        },
    )
    token: str | None = field(
        default=None,
        repr=False,
        metadata={
            "help": "bearer token every route but health and metrics wants, as vLLM's "
            "--api-key (also what it sends the engines it moves KV with)"
        },
    )
    stream_interval_s: float = field(
        default=0.05,
        metadata={
            "help": "wall seconds between a stream's chunks while it decodes (its last chunk "
            "goes at once); 0: one chunk per batch change"
        },
    )

    def __post_init__(self) -> None:
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ConfigError(f"time_scale must be a finite number > 0, got {self.time_scale}")
        if self.max_running < 1 or self.chunk_tokens < 1 or self.decode_reserve < 0:
            raise ConfigError("max_running and chunk_tokens must be >= 1, decode_reserve >= 0")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.node < 0:
            raise ConfigError(f"node must be >= 0, got {self.node}")
        if not 0 < self.inter_node_gbs < math.inf:
            raise ConfigError(f"inter_node_gbs must be finite and > 0, got {self.inter_node_gbs}")
        if self.token is not None and len(self.token) < 16:
            raise ConfigError("a token needs 16 characters or more")
        if not self.stream_interval_s >= 0:
            raise ConfigError(f"stream_interval_s must be >= 0, got {self.stream_interval_s}")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.spec.model

    @property
    def links(self) -> KvLinks:
        """What its KV moves over (`loom.perf.transfer`)."""
        return KvLinks.of(self.spec.model, self.spec.gpu, self.node, self.inter_node_gbs)

    def latency(self) -> RooflineLatencyModel:
        return RooflineLatencyModel(self.spec.gpu, self.spec.model, tp=self.spec.tp)
