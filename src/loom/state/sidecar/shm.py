"""Memory shared between a worker and its sidecar: a worker exports its tensors (CPU ones in a
shared-memory file named after its pid, CUDA ones as CUDA IPC handles) and the sidecar maps them;
a file whose creator died unmapped is an orphan that `sweep_orphans` removes."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from loom.state.errors import BadMessage
from loom.state.manager import StateKey
from loom.state.sidecar.wire import Blob, CudaExport, Export, ShmExport
from loom.state.tiers import Deferred, nbytes

__all__ = [
    "PREFIX",
    "Mapper",
    "alloc_targets",
    "blob",
    "dtype_name",
    "export_tensors",
    "shm_dir",
    "sweep_orphans",
    "to_dtype",
    "unblob",
    "unlink_exports",
]

PREFIX = "loom-state-"  # a shared-memory export's file: loom-state-<creator pid>-<random>
_ALIGN = 64  # every tensor in a shared-memory export starts on a 64-byte boundary


def shm_dir() -> str:
    d = "/dev/shm"
    return d if os.path.isdir(d) and os.access(d, os.W_OK) else tempfile.gettempdir()


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def to_dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise BadMessage(f"{name!r} is no torch dtype")
    return dtype


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _size_of(shape: tuple[int, ...], dtype: Any) -> int:
    import torch

    return _numel(shape) * torch.empty((), dtype=dtype).element_size()


class _ShmBlock:
    """One shared-memory file holding several tensors at aligned offsets (one per transfer)."""

    def __init__(self, sizes: list[int]) -> None:
        import torch

        self.offsets = []
        total = 0
        for n in sizes:
            self.offsets.append(total)
            total += -(-max(n, 1) // _ALIGN) * _ALIGN
        self.path = os.path.join(shm_dir(), f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(total, 1))
        finally:
            os.close(fd)
        self.buf = torch.from_file(self.path, shared=True, size=max(total, 1), dtype=torch.uint8)

    def view(self, i: int, shape: tuple[int, ...], dtype: Any) -> Any:
        off = self.offsets[i]
        return self.buf[off : off + _size_of(shape, dtype)].view(dtype).view(shape)

    def export(self, i: int, key: StateKey, shape: tuple[int, ...], dtype: Any) -> ShmExport:
        return ShmExport(
            key=key, path=self.path, offset=self.offsets[i], shape=shape, dtype=dtype_name(dtype)
        )

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _cuda_export(key: StateKey, t: Any) -> CudaExport:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

    rebuild, args = reduce_tensor(t.detach())
    assert rebuild is rebuild_cuda_tensor, f"a CUDA tensor reduced by {rebuild.__name__}"
    (_, size, stride, offset, _, dtype, device, handle, size_bytes, offset_bytes, _,
     ref_handle, ref_offset, event_handle, event_sync) = args  # fmt: skip
    return CudaExport(
        key=key, shape=tuple(size), stride=tuple(stride), offset=int(offset),
        dtype=dtype_name(dtype), device=int(device), handle=bytes(handle),
        size_bytes=int(size_bytes), offset_bytes=int(offset_bytes), ref_handle=bytes(ref_handle),
        ref_offset=int(ref_offset), event_sync=bool(event_sync),
        event_handle=None if event_handle is None else bytes(event_handle),
    )  # fmt: skip


def _rebuild_cuda(e: CudaExport) -> Any:
    import torch
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return rebuild_cuda_tensor(
        torch.Tensor, torch.Size(e.shape), e.stride, e.offset, torch.storage.TypedStorage,
        to_dtype(e.dtype), e.device, e.handle, e.size_bytes, e.offset_bytes, False,
        e.ref_handle, e.ref_offset, e.event_handle, e.event_sync,
    )  # fmt: skip


def export_tensors(tensors: Mapping[StateKey, Any]) -> tuple[list[Export], Callable[[], None]]:
    """What the sidecar needs to map `tensors`: CUDA IPC handles for CUDA tensors; CPU ones are
    copied into one shared-memory file. Call the returned cleanup once the sidecar answered."""
    out: list[Export] = [_cuda_export(k, t) for k, t in tensors.items() if t.is_cuda]
    if out:
        import torch

        # what the sidecar copies is the memory as it is once queued work is done: a mapping it
        # reuses does not wait for this process's streams
        for device in {t.device for t in tensors.values() if t.is_cuda}:
            torch.cuda.current_stream(device).synchronize()
    cpu = [k for k, t in tensors.items() if not t.is_cuda]
    if not cpu:
        return out, lambda: None
    block = _ShmBlock([nbytes(tensors[k]) for k in cpu])
    for i, k in enumerate(cpu):
        t = tensors[k]
        block.view(i, tuple(t.shape), t.dtype).copy_(t.detach())
        out.append(block.export(i, k, tuple(t.shape), t.dtype))
    return out, block.unlink


def alloc_targets(
    metas: Mapping[StateKey, tuple[tuple[int, ...], Any]], device: str = "cpu"
) -> tuple[dict[StateKey, Any], list[Export], Callable[[], None]]:
    """Fresh buffers for a load, exported for the sidecar to fill: (the worker's tensors, the
    exports, cleanup). On the CPU the tensors are views of one shared-memory file."""
    import torch

    keys = sorted(metas)
    if device != "cpu":
        fresh = {k: torch.empty(metas[k][0], dtype=metas[k][1], device=device) for k in keys}
        cuda: list[Export] = [_cuda_export(k, v) for k, v in fresh.items()]
        return fresh, cuda, lambda: None
    block = _ShmBlock([_size_of(tuple(metas[k][0]), metas[k][1]) for k in keys])
    views: dict[StateKey, Any] = {}
    exports: list[Export] = []
    for i, k in enumerate(keys):
        shape, dtype = tuple(metas[k][0]), metas[k][1]
        views[k] = block.view(i, shape, dtype)
        exports.append(block.export(i, k, shape, dtype))
    return views, exports, block.unlink


def blob(t: Any) -> Blob:
    """A tensor's bytes, for a message (the CPU copy's buffer, not copied again)."""
    import torch

    flat = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    # NOTE: msgspec encodes any buffer; a decoded Blob holds a bytearray
    data: Any = memoryview(flat)
    return Blob(shape=tuple(t.shape), dtype=dtype_name(t.dtype), data=data)


def unblob(b: Blob) -> Any:
    import torch

    dtype = to_dtype(b.dtype)
    if _size_of(b.shape, dtype) != len(b.data):
        raise BadMessage(f"a tensor of {b.shape} {b.dtype} in {len(b.data)} bytes")
    if not b.data:
        return torch.empty(b.shape, dtype=dtype)
    return torch.frombuffer(b.data, dtype=torch.uint8).view(dtype).view(b.shape)


def unlink_exports(exports: list[Export]) -> None:
    """Remove the shared-memory files of exports never mapped (their call ended unserved)."""
    for e in exports:
        if isinstance(e, ShmExport) and os.path.basename(e.path).startswith(PREFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(e.path)


def sweep_orphans(directory: str | None = None) -> list[str]:
    """Remove the shared-memory exports whose creator is dead (it was killed before its
    sidecar mapped them); returns their paths."""
    directory = directory or shm_dir()
    gone = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            if not name.startswith(PREFIX):
                continue
            pid = name[len(PREFIX) :].split("-", 1)[0]
            if not pid.isdigit() or _alive(int(pid)):
                continue
            path = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                if os.stat(path).st_uid == os.getuid():
                    os.unlink(path)
                    gone.append(path)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Mapper:
    """The sidecar's side of the exports of one call: each export becomes a `Deferred` tensor,
    mapped when a copy first needs it (each shared-memory file once). Every export is mapped
    by the end of the call (`finish`), used or not: a CUDA export's producer keeps its memory
    until the mapping is made and dropped. The mapper holds no mapping it made: each goes as
    soon as the StateManager and the copies are done with it. `hold`: a mapping of the same
    memory made earlier, kept until this one is made (which then reuses it)."""

    def __init__(self) -> None:
        self._files: dict[str, Any] = {}
        self._pending: dict[int, Deferred] = {}  # not mapped yet
        self.map_s = 0.0

    def __call__(self, export: Export, hold: Any = None) -> Deferred:
        if isinstance(export, CudaExport):
            make: Callable[[], Any] = lambda: _rebuild_cuda(export)  # noqa: E731
        else:
            make = lambda: self._shm(export)  # noqa: E731
        dtype = to_dtype(export.dtype)
        held = [hold]

        def timed() -> Any:
            t0 = time.perf_counter()
            try:
                return make()
            finally:
                self._pending.pop(id(d), None)
                held.clear()
                self.map_s += time.perf_counter() - t0

        d = Deferred(tuple(export.shape), dtype, timed)
        self._pending[id(d)] = d
        return d

    def _shm(self, e: ShmExport) -> Any:
        import torch

        buf = self._files.get(e.path)
        if buf is None:
            if not os.path.basename(e.path).startswith(PREFIX):
                raise BadMessage(f"{e.path} is not a state export")
            size = os.path.getsize(e.path)
            buf = torch.from_file(e.path, shared=True, size=size, dtype=torch.uint8)
            self._files[e.path] = buf
            with contextlib.suppress(FileNotFoundError):
                os.unlink(e.path)  # mapped on both sides: nothing is left if a worker dies
        n = _size_of(e.shape, to_dtype(e.dtype))
        if e.offset < 0 or e.offset + n > buf.numel():
            raise BadMessage(f"{e.path}: {n} bytes at {e.offset} lie outside its {buf.numel()}")
        return buf[e.offset : e.offset + n].view(to_dtype(e.dtype)).view(e.shape)

    def finish(self) -> None:
        """Map every export not mapped yet (what nothing holds goes again at once); the first
        failure is raised after the rest."""
        error: BaseException | None = None
        while self._pending:
            _, d = self._pending.popitem()
            try:
                d.resolve()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    def forget(self) -> None:
        """Let go of this call's shared-memory files (mappings the StateManager holds stay)."""
        self._pending.clear()
        self._files.clear()
