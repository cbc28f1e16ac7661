"""Choosing a tensor backend of the weight codec: numpy's, or torch's (imported on first use,
so that the codec imports no torch where none is needed)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from loom.core.errors import ConfigError
from loom.state.weights.backends import NUMPY_OPS, Backend, TensorOps

__all__ = ["backend_of", "tensor_ops"]


def _torch_ops() -> TensorOps:
    try:
        from loom.state.weights.torch_ops import TORCH_OPS
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError("the torch backend needs torch (pip install 'loom-rl[torch]')") from exc
    return TORCH_OPS


def tensor_ops(backend: Backend | str) -> TensorOps:
    """The ops of `backend` (or its value); torch is imported only here, on first use."""
    try:
        backend = Backend(backend)
    except ValueError:
        raise ConfigError(f"unknown backend {backend!r}; known: numpy, torch") from None
    return NUMPY_OPS if backend is Backend.NUMPY else _torch_ops()


def backend_of(x: Any) -> Backend:
    """The backend that holds `x`, or `ConfigError` for anything else."""
    if isinstance(x, np.ndarray):
        return Backend.NUMPY
    torch = sys.modules.get("torch")  # a torch tensor implies torch is already imported
    if torch is not None and isinstance(x, torch.Tensor):
        return Backend.TORCH
    raise ConfigError(
        "expected a numpy uint16 array or a torch bfloat16 tensor (or a float32 array or "
        f"tensor), got {type(x).__name__}"
    )
