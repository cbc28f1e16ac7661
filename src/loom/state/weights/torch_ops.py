"""The weight codec's torch backend: bf16 tensors on any device; only changed bits leave it.

Imported lazily by `backends.tensor_ops`, so Loom's core does not need torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from loom.core.errors import ConfigError
from loom.state.weights.backends import Backend, Bits, Indices

__all__ = ["TORCH_OPS", "TorchOps"]


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16)  # same element size: keeps shape and strides, no copy


def _host(arr: np.ndarray, device: torch.device) -> torch.Tensor:
    # NOTE: torch warns on read-only numpy arrays (a `bytes` blob); copy only those.
    src = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
    return src.to(device, non_blocking=False)


class TorchOps:
    backend = Backend.TORCH

    def check(self, x: Any, what: str) -> tuple[int, ...]:
        if not isinstance(x, torch.Tensor):
            raise ConfigError(f"{what} must be a torch tensor, got {type(x).__name__}")
        if x.dtype != torch.bfloat16:
            raise ConfigError(f"{what} must have dtype torch.bfloat16, got {x.dtype}")
        return tuple(x.shape)

    def same_place(self, a: Any, b: Any) -> bool:
        return bool(a.device == b.device)

    def changed(self, new: Any, old: Any) -> Any:
        return torch.ne(_bits(new), _bits(old))

    def count(self, mask: Any) -> int:
        return int(torch.count_nonzero(mask))

    def gather(self, new: Any, mask: Any, idx_out: Indices, val_out: Bits) -> None:
        bits = _bits(new)
        idx = torch.nonzero(mask.reshape(-1)).squeeze(1)
        vals = bits.reshape(-1)[idx] if bits.is_contiguous() else bits[mask]
        idx_out[:] = idx.to(torch.int32).cpu().numpy()
        val_out[:] = vals.cpu().numpy().view(np.uint16)

    def dense(self, new: Any, val_out: Bits) -> None:
        np.copyto(val_out.reshape(new.shape), _bits(new).cpu().numpy().view(np.uint16))

    def scatter(self, target: Any, idx: Indices, vals: Bits) -> None:
        bits = _bits(target)
        index = _host(idx, target.device).to(torch.int64)
        src = _host(vals.view(np.int16), target.device)
        if bits.is_contiguous():
            bits.view(-1).index_copy_(0, index, src)
        else:  # a strided view (a shard slice): index it per dimension, writing through
            bits[torch.unravel_index(index, bits.shape)] = src

    def fill(self, target: Any, vals: Bits) -> None:
        _bits(target).copy_(_host(vals.view(np.int16), target.device).reshape(target.shape))

    def clone(self, x: Any) -> Any:
        return x.clone()

    def empty_like(self, x: Any) -> Any:
        return torch.empty_like(x)

    def empty(self, shape: tuple[int, ...], device: Any) -> Any:
        return torch.empty(shape, dtype=torch.bfloat16, device=device)


TORCH_OPS = TorchOps()
