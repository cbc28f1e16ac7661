"""The weight codec's torch backend: bf16 tensors on any device; only changed bits leave it.

Imported lazily by `ops.tensor_ops`, so Loom's core does not need torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from loom.core.errors import ConfigError
from loom.state.weights.backends import NUMPY_OPS, Backend, Bits, Changes, Indices

__all__ = ["TORCH_OPS", "TorchOps"]


def _bits(x: torch.Tensor) -> torch.Tensor:
    # Same element size: shape and strides kept, no copy; detached, so a Parameter's
    # storage can be read as numpy and written in place.
    return x.detach().view(torch.int16)


def _host(arr: np.ndarray, device: torch.device) -> torch.Tensor:
    # NOTE: torch warns on read-only numpy arrays (a `bytes` blob); copy only those.
    return torch.from_numpy(arr if arr.flags.writeable else arr.copy()).to(device)


class TorchOps:
    """torch kernels, on the tensors' device: a GPU finds and gathers the changes itself.

    NOTE: with `numpy_on_cpu` (the default), CPU tensors go to the numpy kernels through
    views that share their memory: on CPU `torch.nonzero` runs at about a third of
    `np.flatnonzero`'s speed, and the whole encode misses 0.5 GB/s at 20% changed
    (benchmarks/bench_weight_codec.py measures both paths).
    """

    backend = Backend.TORCH

    def __init__(self, *, numpy_on_cpu: bool = True) -> None:
        self.numpy_on_cpu = numpy_on_cpu

    def _cpu(self, *xs: torch.Tensor) -> bool:
        return self.numpy_on_cpu and all(x.device.type == "cpu" for x in xs)

    def check(self, x: Any, what: str) -> tuple[int, ...]:
        if not isinstance(x, torch.Tensor):
            raise ConfigError(f"{what} must be a torch tensor, got {type(x).__name__}")
        if x.dtype != torch.bfloat16:
            raise ConfigError(f"{what} must have dtype torch.bfloat16, got {x.dtype}")
        return tuple(x.shape)

    def same_place(self, a: Any, b: Any) -> bool:
        return bool(a.device == b.device)

    def count_changed(self, new: Any, old: Any) -> int:
        return int(torch.count_nonzero(torch.ne(_bits(new), _bits(old))))

    def diff(self, new: Any, old: Any, limit: int) -> Changes | None:
        if self._cpu(new, old):
            return NUMPY_OPS.diff(_numpy(new), _numpy(old), limit)
        bits = _bits(new)
        mask = torch.ne(bits, _bits(old))
        nnz = int(torch.count_nonzero(mask))
        if nnz > limit:
            return None
        idx = torch.nonzero(mask.reshape(-1)).squeeze(1)
        vals = bits.reshape(-1)[idx] if bits.is_contiguous() else bits[mask]
        host_idx = idx.to(torch.int32).cpu().numpy()
        return Changes([host_idx], [vals.cpu().numpy().view(np.uint16)], nnz)

    def dense(self, new: Any, val_out: Bits) -> None:
        np.copyto(val_out.reshape(new.shape), _bits(new).cpu().numpy().view(np.uint16))

    def scatter(self, target: Any, idx: Indices, vals: Bits) -> None:
        if self._cpu(target):
            NUMPY_OPS.scatter(_numpy(target), idx, vals)
            return
        bits = _bits(target)
        index = _host(idx, target.device).to(torch.int64)
        src = _host(vals.view(np.int16), target.device)
        if bits.is_contiguous():
            bits.view(-1).index_copy_(0, index, src)
        else:  # a strided view (a shard slice): index it per dimension, writing through
            bits[torch.unravel_index(index, bits.shape)] = src

    def fill(self, target: Any, vals: Bits) -> None:
        if self._cpu(target):
            NUMPY_OPS.fill(_numpy(target), vals)
            return
        _bits(target).copy_(_host(vals.view(np.int16), target.device).reshape(target.shape))

    def clone(self, x: Any) -> Any:
        return x.clone()

    def empty_like(self, x: Any) -> Any:
        return torch.empty_like(x)

    def empty(self, shape: tuple[int, ...], device: Any) -> Any:
        return torch.empty(shape, dtype=torch.bfloat16, device=device)


def _numpy(x: torch.Tensor) -> np.ndarray:
    """The bits of CPU tensor `x` as a numpy view sharing its memory (strides kept)."""
    return _bits(x).numpy().view(np.uint16)


TORCH_OPS = TorchOps()
