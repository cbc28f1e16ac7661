"""A worker-process group's configuration, read by both sides of it (the group that starts
ranks and every rank), and the check of an operation's payload against the group's model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from loom.core.errors import ConfigError
from loom.runtime.cluster.models.ref import BUILTIN_MODEL, ModelInfo, ModelRef, parse_model
from loom.runtime.cluster.payloads import FAULT_OP, check_payload

__all__ = ["WorkerGroupConfig", "check_op"]


@dataclass(frozen=True, kw_only=True)
class WorkerGroupConfig:
    name: str
    dp: int = 2
    vocab: int = 128
    dim: int = 64
    layers: int = 2
    heads: int = 4
    seed: int = 0
    lr: float = 1e-3
    # what it runs (`models.parse_model`): "tiny" (vocab, dim, layers, heads above), a local
    # Hugging Face directory, or a worker class "module:Class"; its options as keywords
    model: str = "tiny"
    model_options: dict[str, Any] = field(default_factory=dict)
    # "auto": a GPU per rank where CUDA has one for each (NCCL), else the CPU (gloo)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    device_bytes: int | None = None  # a rank's device tier on its own sidecar (None: all)
    host_bytes: int = 1 << 30
    disk_bytes: int = 4 << 30
    state_dir: Path | None = None
    start_timeout_s: float = 120.0
    state_address: str | None = None  # the node's sidecar; a private one when None
    gpu_base: int = 0  # rank r holds the node's GPU gpu_base + r
    start_offloaded: bool = False  # its state is on the sidecar already (a migration)
    settle_s: float = 10.0  # after a rank raised, how long the others have to answer
    peer_grace_s: float = 1.0  # ... and to be seen dead, if their death is why it raised
    faults: bool = False  # accept FAULT_OP (tests: a rank raises, hangs or exits)

    def __post_init__(self) -> None:
        if self.dp < 1:
            raise ConfigError(f"dp must be >= 1, got {self.dp}")
        if self.settle_s < 0:
            raise ConfigError(f"settle_s must be >= 0, got {self.settle_s}")
        if self.peer_grace_s < 0:
            raise ConfigError(f"peer_grace_s must be >= 0, got {self.peer_grace_s}")
        parse_model(self.model)  # (a ConfigError saying why it cannot be one)

    def model_ref(self) -> ModelRef:
        return parse_model(self.model)

    def model_kwargs(self) -> dict[str, Any]:
        """The keywords its worker class is built with (the tiny decoder's shape, or the
        deployment's model options)."""
        if self.model == BUILTIN_MODEL:
            shape = {"vocab": self.vocab, "dim": self.dim, "layers": self.layers}
            return shape | {"heads": self.heads} | self.model_options
        return dict(self.model_options)


def check_op(config: WorkerGroupConfig, info: ModelInfo, op: str, payload: Any) -> None:
    """Refuse a payload the group's model cannot run (ConfigError saying why)."""
    if op == FAULT_OP and not config.faults:
        raise ConfigError(f"unknown operation {op!r} (fault injection is off)")
    check_payload(op, payload, vocab=info.vocab, tp_split=info.tp_split, ranks=config.dp)
