"""Where a tensor of model state can live (PlexRL §4.5.1): the device (the GPU where there is
one; otherwise a capacity-limited CPU tier, as the action server's GPU services fall back to),
host memory (pinned when an accelerator is present, so copies run at DMA speed), and disk.

Each tier holds whole tensors by key and counts its bytes against a capacity; putting past it
is refused (`TierFull`), never silently spilled — the StateManager decides what moves where.
The disk tier writes with O_DIRECT from page-aligned buffers where the filesystem allows it and
falls back to buffered writes with fsync where it does not (tmpfs, some overlay filesystems),
and says which it used (`direct_io`).

Copies into the host tier and into workers' buffers go through a `Copier` (`loom.state.copy`):
chunked and asynchronous on CUDA streams when the StateManager passes its own, complete once
its `sync` returns; the host tier waits for that before a buffer is read, moved or reused.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from loom.core.errors import ConfigError
from loom.state.copy import Copier
from loom.state.errors import TierFull

__all__ = ["Deferred", "DeviceTier", "DiskTier", "HostTier", "Tier", "TierFull", "TierStore"]

ALIGN = 4096  # O_DIRECT needs block-aligned offsets, lengths and buffers


class Tier(StrEnum):
    DEVICE = "device"
    HOST = "host"
    DISK = "disk"


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the torch extra is installed in CI
        raise ConfigError("the StateManager needs torch: pip install 'loom-rl[torch]'") from exc
    return torch


def nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size())


class Deferred:
    """A tensor of known shape and dtype that is made on first use (`resolve`): a worker's
    exported memory, which the sidecar maps only when a copy needs it, so that mapping one
    tensor overlaps the copies of those before it."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, make: Callable[[], Any]) -> None:
        self.shape, self.dtype = tuple(shape), dtype
        self._make: Callable[[], Any] | None = make
        self._tensor: Any = None

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def element_size(self) -> int:
        return int(_torch().empty((), dtype=self.dtype).element_size())

    @property
    def resolved(self) -> bool:
        return self._make is None

    def resolve(self) -> Any:
        if self._make is not None:
            t = self._make()
            if tuple(t.shape) != self.shape or t.dtype != self.dtype:
                raise ConfigError(
                    f"a tensor said to be {self.shape} {self.dtype} is {tuple(t.shape)} {t.dtype}"
                )
            self._tensor, self._make = t, None
        return self._tensor

    def release(self) -> None:
        """Drop the tensor made (its memory mapping goes once nothing else holds it)."""
        self._tensor = None


def resolve(t: Any) -> Any:
    """A tensor, made now if it is `Deferred`."""
    return t.resolve() if isinstance(t, Deferred) else t


@dataclass
class _Meta:
    dtype: Any
    shape: tuple[int, ...]
    nbytes: int


class TierStore:
    """Tensors by key within a byte capacity."""

    tier: Tier

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ConfigError(f"capacity must be >= 0 bytes, got {capacity}")
        self.capacity = capacity
        self.used = 0
        self._meta: dict[Hashable, _Meta] = {}

    def __contains__(self, key: Hashable) -> bool:
        return key in self._meta

    def keys(self) -> Iterator[Hashable]:
        return iter(list(self._meta))

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def size_of(self, key: Hashable) -> int:
        return self._meta[key].nbytes

    def _reserve(self, key: Hashable, t: Any) -> int:
        if key in self._meta:
            raise ConfigError(f"{self.tier} tier holds {key!r} already")
        n = nbytes(t)
        if n > self.free:
            raise TierFull(self.tier, n, self.free)
        self._meta[key] = _Meta(t.dtype, tuple(t.shape), n)
        self.used += n
        return n

    def _release(self, key: Hashable) -> _Meta:
        meta = self._meta.pop(key)
        self.used -= meta.nbytes
        return meta

    def put(self, key: Hashable, t: Any) -> None:
        raise NotImplementedError

    def get(self, key: Hashable) -> Any:
        raise NotImplementedError

    def delete(self, key: Hashable) -> None:
        raise NotImplementedError


class _MemoryTier(TierStore):
    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._data: dict[Hashable, Any] = {}

    def _place(self, t: Any) -> Any:
        raise NotImplementedError

    def put(self, key: Hashable, t: Any) -> None:
        self._reserve(key, t)
        self._data[key] = self._place(t)

    def get(self, key: Hashable) -> Any:
        return self._data[key]

    def delete(self, key: Hashable) -> None:
        self._release(key)
        del self._data[key]


class DeviceTier(_MemoryTier):
    """The accelerator's memory; a CPU tier of the same capacity where there is none.

    `external`: the memory belongs to worker processes, not to the tier's owner (the node's
    sidecar, §5.3): a put keeps the caller's tensor — a mapping of the worker's memory, maybe
    `Deferred` until a `get` needs it — as it is, or copies into the buffer the worker exported
    for that key (`expect`), which is how state is loaded into a worker's memory."""

    tier = Tier.DEVICE

    def __init__(
        self,
        capacity: int,
        device: str | None = None,
        *,
        external: bool = False,
        copier: Copier | None = None,
    ) -> None:
        super().__init__(capacity)
        torch = _torch()
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.external = external
        self.copier = copier or Copier(0, 0)
        self._targets: dict[Hashable, Any] = {}

    def expect(self, key: Hashable, target: Any) -> None:
        """The next put of `key` copies into `target` (a worker's exported buffer)."""
        if not self.external:
            raise ConfigError("only an external device tier takes workers' buffers")
        self._targets[key] = target

    def clear_expected(self) -> None:
        """Forget buffers no put used (a load that failed half way)."""
        self._targets.clear()

    def _place(self, t: Any) -> Any:
        return t  # unused: put is overridden

    def put(self, key: Hashable, t: Any) -> None:
        target = self._targets.pop(key, None)
        self._reserve(key, t)
        if target is not None:
            if tuple(target.shape) != tuple(t.shape) or target.dtype != t.dtype:
                self._release(key)
                raise ConfigError(
                    f"{key!r}: the worker's buffer is {tuple(target.shape)} {target.dtype}, "
                    f"the state is {tuple(t.shape)} {t.dtype}"
                )
            try:
                target = resolve(target)
                self.copier.copy(target, resolve(t))
            except BaseException:
                self._release(key)
                raise
            self._data[key] = target
        elif self.external:
            self._data[key] = t  # a mapping of the worker's own memory
        else:  # the tier owns its copy: the caller may reuse its buffer
            t = resolve(t)
            own = _torch().empty(t.shape, dtype=t.dtype, device=self.device)
            self.copier.copy(own, t)
            self._data[key] = own

    def get(self, key: Hashable) -> Any:
        return resolve(self._data[key])


class HostTier(_MemoryTier):
    """Host memory, pinned when CUDA is present (`pinned` says which). Pinning a buffer costs
    far more than filling it, so freed buffers are kept by size and reused; the pool counts
    against the capacity and gives its buffers up before a put is refused."""

    tier = Tier.HOST

    def __init__(
        self, capacity: int, pin: bool | None = None, copier: Copier | None = None
    ) -> None:
        super().__init__(capacity)
        torch = _torch()
        self.pinned = torch.cuda.is_available() if pin is None else pin
        self.copier = copier or Copier(0, 0)
        self._pool: dict[int, list[Any]] = {}
        self._pooled = 0
        self._raw: dict[Hashable, Any] = {}
        self._filling: dict[Hashable, int] = {}  # keys put by a copy that may be in flight

    def put(self, key: Hashable, t: Any) -> None:
        torch = _torch()
        t = resolve(t)
        n = nbytes(t)
        spare = self._pool.get(n)
        raw = None
        if spare:  # reuse a pinned buffer of this size: its bytes move from the pool to the key
            raw = spare.pop()
            if not spare:
                del self._pool[n]
            self._pooled -= n
        while self.used + self._pooled + n > self.capacity and self._pooled:
            self._shrink()
        try:
            self._reserve(key, t)
        except TierFull:
            if raw is not None:
                self._pool.setdefault(n, []).append(raw)
                self._pooled += n
            raise
        if raw is None:
            raw = torch.empty(n, dtype=torch.uint8, device="cpu", pin_memory=self.pinned)
        view = raw.view(t.dtype).view(t.shape) if n else torch.empty(t.shape, dtype=t.dtype)
        try:
            self.copier.copy(view, t)
        except BaseException:
            self._release(key)
            if n and self.used + self._pooled + n <= self.capacity:
                self._pool.setdefault(n, []).append(raw)
                self._pooled += n
            raise
        self._raw[key] = raw
        self._data[key] = view
        if self.copier.pending:
            self._filling[key] = self.copier.epoch

    def get(self, key: Hashable) -> Any:
        if self._filling.pop(key, None) == self.copier.epoch:  # a copy may still be filling it
            self.copier.sync()
        return super().get(key)

    def delete(self, key: Hashable) -> None:
        self._filling.pop(key, None)
        if self.copier.pending:  # its buffer goes back to the pool: no copy may still use it
            self.copier.sync()
        super().delete(key)
        raw = self._raw.pop(key)
        n = int(raw.numel())
        if n and self.used + self._pooled + n <= self.capacity:
            self._pool.setdefault(n, []).append(raw)
            self._pooled += n

    def _shrink(self) -> None:
        size = max(self._pool)
        self._pool[size].pop()
        if not self._pool[size]:
            del self._pool[size]
        self._pooled -= size


class DiskTier(TierStore):
    """One file per tensor under `root`."""

    tier = Tier.DISK

    def __init__(self, capacity: int, root: Path) -> None:
        super().__init__(capacity)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.direct_io: bool | None = None  # decided by the first write
        self._files: dict[Hashable, Path] = {}
        self._n = 0

    def put(self, key: Hashable, t: Any) -> None:
        n = self._reserve(key, t)
        path = self.root / f"t{self._n:08d}.bin"
        self._n += 1
        raw = t.detach().contiguous().cpu().view(-1).view(_torch().uint8).numpy()
        try:
            self._write(path, memoryview(raw), n)
        except BaseException:
            self._release(key)
            raise
        self._files[key] = path

    def _write(self, path: Path, data: memoryview, n: int) -> None:
        if self.direct_io is not False:
            try:
                self._write_direct(path, data, n)
                self.direct_io = True
                return
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                self.direct_io = False
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    @staticmethod
    def _write_direct(path: Path, data: memoryview, n: int) -> None:
        size = -(-max(n, 1) // ALIGN) * ALIGN
        buf = mmap.mmap(-1, size)  # anonymous maps are page-aligned
        try:
            buf[:n] = data
            fd = os.open(
                path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o600
            )
            try:
                written = os.write(fd, buf)
                if written != size:
                    raise OSError(errno.EIO, f"short direct write to {path}: {written} of {size}")
            finally:
                os.close(fd)
            os.truncate(path, n)
        finally:
            buf.close()

    def get(self, key: Hashable) -> Any:
        torch = _torch()
        meta = self._meta[key]
        path = self._files[key]
        data = bytearray(meta.nbytes)
        with open(path, "rb") as f:
            got = f.readinto(data)
        if got != meta.nbytes:
            raise OSError(errno.EIO, f"{path}: read {got} of {meta.nbytes} bytes")
        flat = (
            torch.frombuffer(data, dtype=torch.uint8)
            if meta.nbytes
            else torch.empty(0, dtype=torch.uint8)
        )
        return flat.view(meta.dtype).reshape(meta.shape).clone()

    def delete(self, key: Hashable) -> None:
        self._release(key)
        path = self._files.pop(key)
        path.unlink(missing_ok=True)
