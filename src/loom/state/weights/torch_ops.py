"""The weight codec's torch backend: bf16 and float32 tensors on any device; only changed bits
leave it.

Imported lazily by `ops.tensor_ops`, so Loom's core does not need torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from loom.core.errors import ConfigError
from loom.state.weights.backends import NUMPY_OPS, Backend, Bits, Changes, DType, Indices

__all__ = ["TORCH_OPS", "TorchOps"]

_SIGNED = {torch.bfloat16: torch.int16, torch.float32: torch.int32}
_UNSIGNED = {torch.bfloat16: np.uint16, torch.float32: np.uint32}
_SIGNED_NP = {np.dtype(np.uint16): np.int16, np.dtype(np.uint32): np.int32}


def _bits(x: torch.Tensor) -> torch.Tensor:
    # Same element size: shape and strides kept, no copy; detached, so a Parameter's
    # storage can be read as numpy and written in place.
    return x.detach().view(_SIGNED[x.dtype])


def _signed(vals: Bits) -> np.ndarray:
    """Raw bits as the signed integers torch holds them in (a view)."""
    return vals.view(_SIGNED_NP[vals.dtype])


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
        if x.dtype not in _SIGNED:
            raise ConfigError(
                f"{what} must have dtype torch.bfloat16 or torch.float32, got {x.dtype}"
            )
        return tuple(x.shape)

    def dtype(self, x: Any) -> DType:
        return DType.BF16 if x.dtype == torch.bfloat16 else DType.F32

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
        return Changes([host_idx], [vals.cpu().numpy().view(_UNSIGNED[new.dtype])], nnz)

    def dense(self, new: Any, val_out: Bits) -> None:
        np.copyto(val_out.reshape(new.shape), _bits(new).cpu().numpy().view(_UNSIGNED[new.dtype]))

    def scatter(self, target: Any, idx: Indices, vals: Bits) -> None:
        if self._cpu(target):
            NUMPY_OPS.scatter(_numpy(target), idx, vals)
            return
        bits = _bits(target)
        index = _host(idx, target.device).to(torch.int64)
        src = _host(_signed(vals), target.device)
        if bits.is_contiguous():
            bits.view(-1).index_copy_(0, index, src)
        else:  # a strided view (a shard slice): index it per dimension, writing through
            bits[torch.unravel_index(index, bits.shape)] = src

    def fill(self, target: Any, vals: Bits) -> None:
        if self._cpu(target):
            NUMPY_OPS.fill(_numpy(target), vals)
            return
        _bits(target).copy_(_host(_signed(vals), target.device).reshape(target.shape))

    def clone(self, x: Any) -> Any:
        return x.clone()

    def empty_like(self, x: Any) -> Any:
        return torch.empty_like(x)

    def empty(self, shape: tuple[int, ...], device: Any, dtype: DType) -> Any:
        kind = torch.bfloat16 if dtype is DType.BF16 else torch.float32
        return torch.empty(shape, dtype=kind, device=device)


def _numpy(x: torch.Tensor) -> np.ndarray:
    """CPU tensor `x` as a numpy view sharing its memory (strides kept): bf16 as its uint16
    bits, float32 as float32."""
    if x.dtype == torch.bfloat16:
        return _bits(x).numpy().view(np.uint16)
    return x.detach().numpy()


TORCH_OPS = TorchOps()
