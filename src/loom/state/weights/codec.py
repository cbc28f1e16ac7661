"""Sparse-delta codec for bf16 (and float32) weights (ROSE §4.2): a blob carries the new bits at
the positions that changed since the receiver's version, or the whole tensor when too many
changed.

Between consecutive RL steps most bf16 weights keep their exact bits (>95% in ROSE Fig. 6,
~99% across steps in Fig. 11a), so a delta ships `6 · nnz` bytes (int32 flat index + the new
bf16 bits) instead of `2 · numel`. It ships the NEW bits, not `new - old`: a bf16 subtraction
is not invertible bit for bit. Positions are compared as raw 16-bit patterns, so -0.0 vs +0.0
counts as a change and a NaN that keeps its payload does not. A float32 tensor (a trainer and
an engine that both run in fp32, whose logprobs must agree to fp32 precision) goes the same way
with 32-bit patterns: `8 · nnz` bytes per delta, `4 · numel` dense.

Wire format, little-endian; the header is `36 + 8 · ndim` bytes (52 for a matrix):

    magic      4s   b"LMWB"
    format     u8   FORMAT_VERSION
    encoding   u8   Encoding (0 dense, 1 sparse)
    dtype      u8   DType (1 bf16, 2 float32)
    ndim       u8
    base       i64  base_version, -1 for a dense blob (it applies at any version)
    version    i64  version the blob produces
    nnz        u64  positions carried (numel for dense)
    shape      u64 × ndim
    crc32      u32  zlib CRC-32 of every other header byte, then of the payload

then the payload: dense, `numel` u16 (u32 for float32) bits in C order; sparse, `nnz` i32 flat
C-order indices, strictly increasing, then their `nnz` u16 (u32) bits. Equal inputs give equal
bytes on every backend.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeVar

import numpy as np

from loom.core.errors import ConfigError
from loom.state.weights.backends import Backend, DType, TensorOps
from loom.state.weights.ops import backend_of, tensor_ops

__all__ = [
    "DENSE_THRESHOLD",
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_SPARSE_NUMEL",
    "BlobHeader",
    "DType",
    "Encoding",
    "apply",
    "choose_encoding",
    "count_changed",
    "decode",
    "encode",
    "encoded_nbytes",
    "header_nbytes",
    "read_header",
]

MAGIC = b"LMWB"
FORMAT_VERSION = 1
# Changed fraction above which a blob is dense. Bytes alone cross over at 1/3 (6·nnz = 2·numel);
# ROSE §6.3 (Fig. 11b) measures the end-to-end crossover at ~20%, where index metadata and
# (de)sparsification time eat the saving.
DENSE_THRESHOLD = 0.20
# Flat indices are int32, so a delta covers at most 2^31 elements. Larger tensors are refused:
# encode slices of them (a shard plan's pieces are far smaller), or send them dense.
MAX_SPARSE_NUMEL = 2**31

_FIXED = struct.Struct("<4sBBBBqqQ")
_DIM = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_MAX_VERSION = 2**63 - 1

Buffer = bytes | bytearray | memoryview
W = TypeVar("W")


class Encoding(IntEnum):
    DENSE = 0  # every element's bits
    SPARSE = 1  # changed positions and their new bits


_ENCODINGS = frozenset(int(e) for e in Encoding)
_DTYPES = frozenset(int(d) for d in DType)


@dataclass(frozen=True, kw_only=True)
class BlobHeader:
    """What a blob says about itself; `nbytes` is the size of the whole blob."""

    encoding: Encoding
    dtype: DType
    shape: tuple[int, ...]
    nnz: int  # positions carried; numel when dense
    version: int  # version of the tensor the blob produces
    base_version: int | None  # version a sparse delta applies to; None when dense

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def header_nbytes(self) -> int:
        return header_nbytes(len(self.shape))

    @property
    def payload_nbytes(self) -> int:
        return _payload_nbytes(self.encoding, self.numel, self.nnz, self.dtype)

    @property
    def nbytes(self) -> int:
        return self.header_nbytes + self.payload_nbytes


def header_nbytes(ndim: int) -> int:
    """Bytes of a blob header for a tensor of `ndim` dimensions: `36 + 8 · ndim`."""
    return _FIXED.size + ndim * _DIM.size + _CRC.size


def _payload_nbytes(encoding: Encoding, numel: int, nnz: int, dtype: DType) -> int:
    size = dtype.itemsize
    return size * numel if encoding is Encoding.DENSE else (4 + size) * nnz


def choose_encoding(numel: int, nnz: int, dense_threshold: float = DENSE_THRESHOLD) -> Encoding:
    """Sparse while at most `dense_threshold` of the `numel` elements changed, else dense."""
    return Encoding.DENSE if nnz > _sparse_limit(numel, dense_threshold) else Encoding.SPARSE


def _sparse_limit(numel: int, dense_threshold: float) -> int:
    """Most changed elements a sparse blob of `numel` elements carries."""
    _check_threshold(dense_threshold)
    return math.floor(dense_threshold * numel)


def encoded_nbytes(
    shape: tuple[int, ...],
    nnz: int | None,
    *,
    dense_threshold: float = DENSE_THRESHOLD,
    dtype: DType = DType.BF16,
) -> int:
    """Size of the blob `encode` writes for a tensor of `shape` with `nnz` changed elements
    (`None`: a dense snapshot): `header_nbytes(ndim) + 6 · nnz`, or `+ 2 · numel` when dense
    (float32: 8 and 4)."""
    numel = math.prod(shape)
    if nnz is None:
        encoding = Encoding.DENSE
    else:
        if not 0 <= nnz <= numel:
            raise ConfigError(f"nnz must be in [0, {numel}] for shape {shape}, got {nnz}")
        if numel > MAX_SPARSE_NUMEL:
            raise ConfigError(f"a delta indexes at most 2^31 elements, shape {shape} has {numel}")
        encoding = choose_encoding(numel, nnz, dense_threshold)
    return header_nbytes(len(shape)) + _payload_nbytes(encoding, numel, nnz or 0, dtype)


def count_changed(new: Any, old: Any) -> int:
    """Elements whose bits differ between `new` and `old` (the paper's ΔW non-zeros)."""
    ops, _ = _pair(new, old)
    return ops.count_changed(new, old)


def encode(
    new: Any,
    *,
    version: int,
    old: Any | None = None,
    base_version: int | None = None,
    dense_threshold: float = DENSE_THRESHOLD,
) -> bytearray:
    """The blob that turns a tensor at `base_version` holding `old` into `new` at `version`.

    Without `old`, a dense snapshot that applies at any version. With `old` (and its
    `base_version`), a sparse delta, or a dense blob when more than `dense_threshold` of the
    elements changed. `new` and `old` may be strided views (a shard slice): only the slice is
    read, and indices are flat over the slice's own shape.
    """
    _check_threshold(dense_threshold)
    _check_versions(version, base_version, delta=old is not None)
    if old is None:
        ops = tensor_ops(backend_of(new))
        shape = ops.check(new, "new")
        return _write_dense(ops, new, shape, version, ops.dtype(new))
    ops, shape = _pair(new, old)
    numel = math.prod(shape)
    if numel > MAX_SPARSE_NUMEL:
        raise ConfigError(
            f"a delta indexes at most 2^31 elements with int32, got shape {shape} "
            f"({numel} elements): encode slices of it, or a dense snapshot (old=None)"
        )
    dtype = ops.dtype(new)
    changes = ops.diff(new, old, limit=_sparse_limit(numel, dense_threshold))
    if changes is None:  # more than the threshold changed
        return _write_dense(ops, new, shape, version, dtype)
    header = BlobHeader(
        encoding=Encoding.SPARSE,
        dtype=dtype,
        shape=shape,
        nnz=changes.nnz,
        version=version,
        base_version=base_version,
    )
    out = _allocate(header)
    start, nnz = header.header_nbytes, changes.nnz
    if nnz:
        idx_out = np.frombuffer(out, dtype="<i4", count=nnz, offset=start)
        val_out = np.frombuffer(out, dtype=dtype.bits, count=nnz, offset=start + 4 * nnz)
        np.concatenate(changes.idx, out=idx_out)
        np.concatenate(changes.vals, out=val_out)
    _seal(out, header)
    return out


def read_header(blob: Buffer) -> BlobHeader:
    """Parse and check a blob's header and length; the CRC is checked by `apply`/`decode`."""
    view = memoryview(blob).cast("B")
    if len(view) < header_nbytes(0):
        raise ConfigError(f"truncated blob: {len(view)} bytes, a header needs at least 36")
    magic, fmt, enc, dtype, ndim, base, version, nnz = _FIXED.unpack_from(view, 0)
    if magic != MAGIC:
        raise ConfigError(f"not a Loom weight blob: magic {bytes(magic)!r}, expected {MAGIC!r}")
    if fmt != FORMAT_VERSION:
        raise ConfigError(f"blob format version {fmt}, this build reads {FORMAT_VERSION}")
    if enc not in _ENCODINGS or dtype not in _DTYPES:
        raise ConfigError(f"corrupt blob: unknown encoding {enc} or dtype code {dtype}")
    if len(view) < header_nbytes(ndim):
        raise ConfigError(f"truncated blob: {len(view)} bytes, a {ndim}-d header needs more")
    shape = tuple(_DIM.unpack_from(view, _FIXED.size + i * _DIM.size)[0] for i in range(ndim))
    header = BlobHeader(
        encoding=Encoding(enc),
        dtype=DType(dtype),
        shape=shape,
        nnz=nnz,
        version=version,
        base_version=None if base == -1 else base,
    )
    _check_header(header, base)
    if len(view) != header.nbytes:
        what = "truncated" if len(view) < header.nbytes else "trailing bytes in"
        raise ConfigError(f"{what} blob: {len(view)} bytes, its header says {header.nbytes}")
    return header


def apply(blob: Buffer, current: W, *, current_version: int | None, inplace: bool = False) -> W:
    """`current` (at `current_version`) updated by `blob`: bit for bit the encoded tensor.

    A sparse delta needs `current_version == base_version`, else `ConfigError` (such a worker
    pulls the dense blob); a dense blob applies at any version. With `inplace`, `current` itself
    (which may be a strided view into a larger shard) is written and returned.
    """
    header = read_header(blob)
    _check_crc(blob, header)
    ops = tensor_ops(backend_of(current))
    shape = ops.check(current, "current")
    if shape != header.shape:
        raise ConfigError(f"blob is for shape {header.shape}, the tensor has shape {shape}")
    if ops.dtype(current) is not header.dtype:
        raise ConfigError(
            f"blob holds {header.dtype.name} elements, the tensor {ops.dtype(current).name} ones"
        )
    if header.encoding is Encoding.DENSE:
        target = current if inplace else ops.empty_like(current)
        ops.fill(target, _values(blob, header))
        return target
    if current_version != header.base_version:
        raise ConfigError(
            f"delta v{header.base_version}->v{header.version} applies to a tensor at "
            f"v{header.base_version}, this one is at v{current_version}: pull the dense blob"
        )
    idx = _indices(blob, header)
    target = current if inplace else ops.clone(current)
    if header.nnz:
        ops.scatter(target, idx, _values(blob, header))
    return target


def decode(blob: Buffer, *, backend: Backend | str = Backend.NUMPY, device: Any = None) -> Any:
    """A new tensor from a dense blob (`device` for torch); a sparse delta needs `apply`."""
    header = read_header(blob)
    if header.encoding is Encoding.SPARSE:
        raise ConfigError(
            f"blob is a delta v{header.base_version}->v{header.version}: apply it to the "
            f"tensor at v{header.base_version}, or pull the dense blob"
        )
    _check_crc(blob, header)
    ops = tensor_ops(backend)
    target = ops.empty(header.shape, device, header.dtype)
    ops.fill(target, _values(blob, header))
    return target


def _pair(new: Any, old: Any) -> tuple[TensorOps, tuple[int, ...]]:
    backend = backend_of(new)
    if backend_of(old) is not backend:
        raise ConfigError(f"new is a {backend} tensor but old is a {backend_of(old)} one")
    ops = tensor_ops(backend)
    shape, old_shape = ops.check(new, "new"), ops.check(old, "old")
    if shape != old_shape:
        raise ConfigError(f"new has shape {shape} but old has shape {old_shape}")
    if not ops.same_place(new, old):
        raise ConfigError("new and old are on different devices")
    if ops.dtype(new) is not ops.dtype(old):
        raise ConfigError(f"new holds {ops.dtype(new).name}, old {ops.dtype(old).name}")
    return ops, shape


def _write_dense(
    ops: TensorOps, new: Any, shape: tuple[int, ...], version: int, dtype: DType
) -> bytearray:
    numel = math.prod(shape)
    header = BlobHeader(
        encoding=Encoding.DENSE,
        dtype=dtype,
        shape=shape,
        nnz=numel,
        version=version,
        base_version=None,
    )
    out = _allocate(header)
    if numel:
        bits = np.frombuffer(out, dtype=dtype.bits, count=numel, offset=header.header_nbytes)
        ops.dense(new, bits)
    _seal(out, header)
    return out


def _allocate(header: BlobHeader) -> bytearray:
    if len(header.shape) > 255:
        raise ConfigError(f"at most 255 dimensions, got {len(header.shape)}")
    out = bytearray(header.nbytes)
    base = -1 if header.base_version is None else header.base_version
    _FIXED.pack_into(
        out,
        0,
        MAGIC,
        FORMAT_VERSION,
        header.encoding,
        header.dtype,
        len(header.shape),
        base,
        header.version,
        header.nnz,
    )
    for i, dim in enumerate(header.shape):
        _DIM.pack_into(out, _FIXED.size + i * _DIM.size, dim)
    return out


def _crc(view: memoryview, header: BlobHeader) -> int:
    at = header.header_nbytes - _CRC.size
    return zlib.crc32(view[at + _CRC.size :], zlib.crc32(view[:at]))


def _seal(out: bytearray, header: BlobHeader) -> None:
    _CRC.pack_into(out, header.header_nbytes - _CRC.size, _crc(memoryview(out), header))


def _check_crc(blob: Buffer, header: BlobHeader) -> None:
    view = memoryview(blob).cast("B")
    (stored,) = _CRC.unpack_from(view, header.header_nbytes - _CRC.size)
    if stored != _crc(view, header):
        raise ConfigError("corrupt blob: CRC-32 mismatch (bytes changed in transit?)")


def _indices(blob: Buffer, header: BlobHeader) -> np.ndarray:
    idx = np.frombuffer(blob, dtype="<i4", count=header.nnz, offset=header.header_nbytes)
    if header.nnz and (
        idx[0] < 0 or idx[-1] >= header.numel or not bool(np.all(idx[1:] > idx[:-1]))
    ):
        raise ConfigError(
            f"corrupt blob: indices must be strictly increasing in [0, {header.numel})"
        )
    return idx


def _values(blob: Buffer, header: BlobHeader) -> np.ndarray:
    offset = header.header_nbytes + (4 * header.nnz if header.encoding is Encoding.SPARSE else 0)
    return np.frombuffer(blob, dtype=header.dtype.bits, count=header.nnz, offset=offset)


def _check_header(header: BlobHeader, raw_base: int) -> None:
    if header.encoding is Encoding.DENSE:
        if raw_base != -1 or header.nnz != header.numel:
            raise ConfigError("corrupt blob: a dense blob has base -1 and nnz == numel")
    elif not 0 <= header.nnz <= min(header.numel, MAX_SPARSE_NUMEL):
        raise ConfigError(f"corrupt blob: nnz {header.nnz} for shape {header.shape}")
    try:
        _check_versions(
            header.version, header.base_version, delta=header.encoding is Encoding.SPARSE
        )
    except ConfigError as exc:
        raise ConfigError(f"corrupt blob: {exc}") from None


def _check_versions(version: int, base_version: int | None, *, delta: bool) -> None:
    if not 0 <= version <= _MAX_VERSION:
        raise ConfigError(f"version must be in [0, 2^63), got {version}")
    if delta and base_version is None:
        raise ConfigError("a delta (old given) needs the base_version old is at")
    if not delta and base_version is not None:
        raise ConfigError("base_version is only meaningful with old (a delta)")
    if base_version is not None and not 0 <= base_version < version:
        raise ConfigError(f"base_version must be in [0, version={version}), got {base_version}")


def _check_threshold(dense_threshold: float) -> None:
    if not 0.0 <= dense_threshold <= 1.0:
        raise ConfigError(f"dense_threshold must be in [0, 1], got {dense_threshold}")
