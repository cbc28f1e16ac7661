"""Building a rank's worker from what a deployment's `model` names (in a worker process: this
imports torch and the model)."""

from __future__ import annotations

from typing import Any

import torch

from loom.core.errors import ConfigError
from loom.runtime.cluster.models.hf import HFWorker
from loom.runtime.cluster.models.ref import ModelKind, ModelRef, load_class
from loom.runtime.cluster.models.tiny import TinyWorker
from loom.runtime.cluster.models.worker import ModelWorker

__all__ = ["build_worker"]


def build_worker(
    ref: ModelRef, *, seed: int, device: torch.device, options: dict[str, Any]
) -> ModelWorker:
    """The rank's worker: the tiny decoder, a Hugging Face model, or the user's class."""
    cls: Any
    if ref.kind is ModelKind.BUILTIN:
        cls = TinyWorker
    elif ref.kind is ModelKind.HF:
        cls, options = HFWorker, {"path": ref.target, **options}
    else:
        cls = load_class(ref.target)
        if not (isinstance(cls, type) and issubclass(cls, ModelWorker)):
            raise ConfigError(
                f"{ref.target} is not a ModelWorker subclass "
                "(loom.runtime.cluster.models.ModelWorker)"
            )
    try:
        worker: ModelWorker = cls(seed=seed, device=device, **options)
    except TypeError as exc:
        raise ConfigError(f"cannot build {ref.target} with {sorted(options)}: {exc}") from exc
    if not hasattr(worker, "module") or not hasattr(worker, "vocab_size"):
        raise ConfigError(f"{ref.target} must set self.module and self.vocab_size")
    return worker
