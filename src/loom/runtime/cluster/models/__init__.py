"""The models a deployment runs: `ModelWorker` (the contract a user's worker class meets),
the built-in tiny decoder and Hugging Face models as workers, and the parsing of a
deployment's `model`."""

from loom.runtime.cluster.models.ref import (
    BUILTIN_MODEL,
    ModelInfo,
    ModelKind,
    ModelRef,
    parse_model,
)

__all__ = ["BUILTIN_MODEL", "ModelInfo", "ModelKind", "ModelRef", "ModelWorker", "parse_model"]


def __getattr__(name: str) -> object:  # torch only where a worker is used
    if name == "ModelWorker":
        from loom.runtime.cluster.models import worker

        return getattr(worker, name)
    raise AttributeError(name)
