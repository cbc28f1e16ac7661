"""The sparse-delta codec: bit-exact round trips, its size formula and dense switch, identical
bytes from numpy and torch, float32 as well as bf16, versions enforced, and bad or corrupt input
refused."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from loom.core.errors import ConfigError
from loom.state.weights import (
    DENSE_THRESHOLD,
    MAX_SPARSE_NUMEL,
    Encoding,
    apply,
    backends,
    bf16_bits_to_float32,
    count_changed,
    decode,
    encode,
    encoded_nbytes,
    float32_to_bf16_bits,
    header_nbytes,
    read_header,
)

# ±0, ±inf, quiet and signalling NaNs with payloads, the smallest and largest subnormals.
SPECIALS = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x0001, 0x807F]
bf16_bits = st.one_of(st.sampled_from(SPECIALS), st.integers(0, 0xFFFF))
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=9)


@st.composite
def weight_pairs(draw: st.DrawFn, shape: Any = shapes) -> tuple[np.ndarray, np.ndarray, int]:
    """`(old, new, nnz)`: random bf16 bits and a copy with a random fraction (0 to 1) changed."""
    old = draw(hnp.arrays(np.uint16, shape, elements=bf16_bits))
    fraction = draw(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mask = rng.random(old.shape) < fraction
    flips = rng.integers(1, 0x10000, size=old.shape, dtype=np.uint16)  # never 0: bits differ
    new = np.where(mask, old ^ flips, old)
    return old, new, int(mask.sum())


def as_torch(bits: np.ndarray) -> Any:
    torch = pytest.importorskip("torch", reason="needs the torch extra")
    return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)


def as_bits(tensor: Any) -> np.ndarray:
    import torch

    return tensor.view(torch.int16).numpy().view(np.uint16)


@contextmanager
def patched(obj: object, name: str, value: Any) -> Iterator[None]:
    """`obj.name = value` for the block (hypothesis runs many examples per fixture)."""
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


# The numpy diff works in blocks of `CHUNK` elements (rows of them for a matrix); tiny blocks
# make every example cross block boundaries and hit the early exit into dense.
chunks = st.sampled_from([1, 5, 64, backends.CHUNK])
thresholds = st.sampled_from([0.0, DENSE_THRESHOLD, 1 / 3, 1.0]) | st.floats(0.0, 1.0)


@settings(max_examples=150, deadline=None)
@given(weight_pairs(), thresholds, chunks)
def test_delta_round_trip_is_bit_exact_and_sized_by_formula(
    pair: tuple[np.ndarray, np.ndarray, int], threshold: float, chunk: int
) -> None:
    old, new, nnz = pair
    with patched(backends, "CHUNK", chunk):
        blob = encode(new, old=old, version=8, base_version=7, dense_threshold=threshold)
    header = read_header(blob)
    sparse = nnz <= threshold * new.size
    assert header.encoding is (Encoding.SPARSE if sparse else Encoding.DENSE)
    payload = 6 * nnz if sparse else 2 * new.size
    assert len(blob) == header_nbytes(new.ndim) + payload == 36 + 8 * new.ndim + payload
    assert len(blob) == encoded_nbytes(new.shape, nnz, dense_threshold=threshold)
    assert header.version == 8 and header.base_version == (7 if sparse else None)
    out = apply(bytes(blob), old, current_version=7)
    assert out.dtype == np.uint16 and np.array_equal(out, new)
    assert count_changed(new, old) == nnz


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.uint16, shapes, elements=bf16_bits), st.integers(0, 100))
def test_dense_snapshot_round_trips_and_applies_at_any_version(bits: np.ndarray, at: int) -> None:
    blob = encode(bits, version=101)
    assert len(blob) == encoded_nbytes(bits.shape, None) == header_nbytes(bits.ndim) + 2 * bits.size
    assert np.array_equal(decode(blob), bits)
    stale = np.zeros_like(bits)
    assert np.array_equal(apply(blob, stale, current_version=at), bits)
    assert not stale.any(), "apply without inplace leaves the tensor alone"


def test_dense_switch_is_strictly_above_the_threshold() -> None:
    old = np.zeros((10, 100), np.uint16)
    for nnz, encoding in [(200, Encoding.SPARSE), (201, Encoding.DENSE)]:
        new = old.copy()
        new.reshape(-1)[:nnz] = 1
        blob = encode(new, old=old, version=1, base_version=0)
        assert read_header(blob).encoding is encoding
    assert read_header(encode(old, old=old, version=1, base_version=0)).nnz == 0
    assert encoded_nbytes((10, 100), 200) == 52 + 1200
    assert encoded_nbytes((10, 100), 201) == 52 + 2000


def test_bits_not_values_decide_what_changed() -> None:
    old = np.array([0x0000, 0x7FC0, 0x7FC1, 0x3F80], np.uint16)  # +0, NaN, NaN', 1.0
    new = np.array([0x8000, 0x7FC0, 0x7FC2, 0x3F80], np.uint16)  # -0, same NaN, other NaN, 1.0
    assert count_changed(new, old) == 2
    blob = encode(new, old=old, version=1, base_version=0, dense_threshold=1.0)
    assert read_header(blob).nnz == 2
    assert np.array_equal(apply(blob, old, current_version=0), new)


@settings(max_examples=60, deadline=None)
@given(
    weight_pairs(shape=hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=12)),
    chunks,
    st.data(),
)
def test_shard_slices_encode_and_apply_through_views(
    pair: tuple[np.ndarray, np.ndarray, int], chunk: int, data: st.DataObject
) -> None:
    old, new, _ = pair
    r0, r1 = sorted(data.draw(st.lists(st.integers(0, old.shape[0]), min_size=2, max_size=2)))
    c0, c1 = sorted(data.draw(st.lists(st.integers(0, old.shape[1]), min_size=2, max_size=2)))
    box = np.s_[r0:r1, c0:c1]
    with patched(backends, "CHUNK", chunk):
        blob = encode(new[box], old=old[box], version=2, base_version=1, dense_threshold=1.0)
    copied = encode(
        new[box].copy(), old=old[box].copy(), version=2, base_version=1, dense_threshold=1.0
    )
    assert blob == copied
    target = old.copy()
    apply(blob, target[box], current_version=1, inplace=True)
    expected = old.copy()
    expected[box] = new[box]
    assert np.array_equal(target, expected), "only the view's elements change"


def test_accepts_bytes_bytearray_and_memoryview() -> None:
    old = np.arange(12, dtype=np.uint16).reshape(3, 4)
    new = old.copy()
    new[1, 2] = 999
    blob = encode(new, old=old, version=3, base_version=2)
    for wire in (bytes(blob), blob, memoryview(blob)):
        assert np.array_equal(apply(wire, old, current_version=2), new)


def test_a_delta_needs_the_receiver_at_its_base_version() -> None:
    old = np.zeros(8, np.uint16)
    new = old.copy()
    new[3] = 1
    delta = encode(new, old=old, version=5, base_version=4)
    with pytest.raises(ConfigError, match=r"v4->v5 applies to a tensor at v4.*at v3.*dense"):
        apply(delta, old, current_version=3)
    with pytest.raises(ConfigError, match="at vNone"):
        apply(delta, old, current_version=None)
    with pytest.raises(ConfigError, match="delta v4->v5"):
        decode(delta)
    assert np.array_equal(apply(delta, old, current_version=4, inplace=True), new)
    assert old[3] == 1, "inplace writes the receiver's tensor"


def test_version_arguments_are_checked() -> None:
    x = np.zeros(4, np.uint16)
    with pytest.raises(ConfigError, match="needs the base_version"):
        encode(x, old=x, version=1)
    with pytest.raises(ConfigError, match="only meaningful with old"):
        encode(x, version=1, base_version=0)
    with pytest.raises(ConfigError, match="base_version must be in"):
        encode(x, old=x, version=3, base_version=3)
    with pytest.raises(ConfigError, match="version must be in"):
        encode(x, version=-1)


@settings(max_examples=80, deadline=None)
@given(weight_pairs(), st.data())
def test_any_corrupted_byte_is_refused(
    pair: tuple[np.ndarray, np.ndarray, int], data: st.DataObject
) -> None:
    old, new, _ = pair
    blob = encode(new, old=old, version=2, base_version=1)
    at = data.draw(st.integers(0, len(blob) - 1))
    corrupt = bytearray(blob)
    corrupt[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(ConfigError):
        apply(corrupt, old, current_version=1)
    cut = data.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(ConfigError, match="truncated"):
        apply(blob[:cut], old, current_version=1)
    with pytest.raises(ConfigError, match="trailing"):
        apply(blob + b"\0", old, current_version=1)


def test_corrupt_header_fields_say_what_is_wrong() -> None:
    x = np.zeros((2, 3), np.uint16)
    blob = encode(x, version=1)
    with pytest.raises(ConfigError, match="magic"):
        read_header(b"NOPE" + blob[4:])
    with pytest.raises(ConfigError, match="format version 9"):
        read_header(blob[:4] + b"\x09" + blob[5:])
    with pytest.raises(ConfigError, match="unknown encoding"):
        read_header(blob[:5] + b"\x07" + blob[6:])
    with pytest.raises(ConfigError, match="CRC"):
        apply(blob[:-1] + b"\x01", x, current_version=None)


def test_bad_tensors_are_refused() -> None:
    x = np.zeros((2, 3), np.uint16)
    with pytest.raises(ConfigError, match="uint16 bits"):
        encode(x.astype(np.float64), version=1)
    with pytest.raises(ConfigError, match="new holds BF16, old F32"):
        encode(x, old=x.astype(np.float32), version=1, base_version=0)
    with pytest.raises(ConfigError, match="blob holds F32 elements, the tensor BF16 ones"):
        apply(encode(x.astype(np.float32), version=1), x, current_version=None)
    with pytest.raises(ConfigError, match="numpy uint16 array or a torch"):
        encode([1, 2], version=1)
    with pytest.raises(ConfigError, match=r"shape \(2, 3\) but old has shape \(3, 2\)"):
        encode(x, old=x.T.copy(), version=1, base_version=0)
    with pytest.raises(ConfigError, match=r"blob is for shape \(2, 3\)"):
        apply(encode(x, version=1), x.reshape(6), current_version=None)
    with pytest.raises(ConfigError, match="dense_threshold"):
        encode(x, old=x, version=1, base_version=0, dense_threshold=1.5)
    with pytest.raises(ConfigError, match="unknown backend"):
        decode(encode(x, version=1), backend="jax")


def test_deltas_over_two_to_the_31_elements_are_refused() -> None:
    huge = np.broadcast_to(np.zeros(1, np.uint16), (MAX_SPARSE_NUMEL + 1,))  # no memory
    with pytest.raises(ConfigError, match="2\\^31 elements with int32"):
        encode(huge, old=huge, version=1, base_version=0)
    with pytest.raises(ConfigError, match="2\\^31"):
        encoded_nbytes(huge.shape, 1, dense_threshold=1.0)


def test_bf16_helpers_round_to_nearest_even() -> None:
    one = 1.0
    ulp = 2.0**-7  # bf16 spacing at 1.0
    cases = {
        one: 0x3F80,
        one + ulp / 2: 0x3F80,  # tie, to even
        one + 3 * ulp / 2: 0x3F82,  # tie, to even (up)
        one + ulp / 2 + 2.0**-20: 0x3F81,  # above the tie
        -0.0: 0x8000,
        3.4e38: 0x7F80,  # overflows to inf
        1e-45: 0x0000,  # the smallest float32 subnormal rounds to +0
        float("nan"): 0x7FC0,
        -float("nan"): 0xFFC0,
    }
    got = float32_to_bf16_bits(np.array(list(cases), np.float32))
    assert [hex(v) for v in got] == [hex(v) for v in cases.values()]
    every = np.arange(0x10000, dtype=np.uint32).astype(np.uint16)
    finite = every[~np.isnan(bf16_bits_to_float32(every))]
    assert np.array_equal(float32_to_bf16_bits(bf16_bits_to_float32(finite)), finite)
    with pytest.raises(ConfigError, match="uint16"):
        bf16_bits_to_float32(np.zeros(2, np.int32))


# --- torch backend -------------------------------------------------------------------------


def torch_kernels(on: bool) -> Any:
    """With `on`, CPU tensors run torch's own kernels (the path a GPU takes), not numpy's."""
    pytest.importorskip("torch", reason="needs the torch extra")
    from loom.state.weights.torch_ops import TORCH_OPS

    return patched(TORCH_OPS, "numpy_on_cpu", not on)


@pytest.mark.torch
@pytest.mark.parametrize("kernels", [False, True], ids=["numpy-kernels", "torch-kernels"])
@settings(max_examples=50, deadline=None)
@given(weight_pairs(), thresholds)
def test_torch_writes_the_same_bytes_as_numpy(
    kernels: bool, pair: tuple[np.ndarray, np.ndarray, int], threshold: float
) -> None:
    old, new, _ = pair
    blob = encode(new, old=old, version=3, base_version=2, dense_threshold=threshold)
    with torch_kernels(kernels):
        tblob = encode(
            as_torch(new), old=as_torch(old), version=3, base_version=2, dense_threshold=threshold
        )
        assert tblob == blob
        assert encode(as_torch(new), version=3) == encode(new, version=3)
        out = apply(bytes(blob), as_torch(old), current_version=2)
        assert np.array_equal(as_bits(out), new)
        assert np.array_equal(as_bits(decode(encode(new, version=3), backend="torch")), new)
        assert count_changed(as_torch(new), as_torch(old)) == count_changed(new, old)


@pytest.mark.torch
@pytest.mark.parametrize("kernels", [False, True], ids=["numpy-kernels", "torch-kernels"])
def test_torch_views_and_parameters_apply_in_place(kernels: bool) -> None:
    torch = pytest.importorskip("torch", reason="needs the torch extra")
    old = np.arange(48, dtype=np.uint16).reshape(6, 8)
    new = old.copy()
    new[1:4, 2:6] += 100
    with torch_kernels(kernels):
        target = as_torch(old)
        blob = encode(as_torch(new)[1:5, 2:7], old=target[1:5, 2:7], version=1, base_version=0)
        assert blob == encode(new[1:5, 2:7], old=old[1:5, 2:7], version=1, base_version=0)
        apply(blob, target[1:5, 2:7], current_version=0, inplace=True)
        assert np.array_equal(as_bits(target), new)
        weight = torch.nn.Parameter(as_torch(old))  # requires grad, as in a live model
        apply(
            encode(as_torch(new), old=weight, version=1, base_version=0),
            weight,
            current_version=0,
            inplace=True,
        )
        assert np.array_equal(as_bits(weight.detach()), new)


@pytest.mark.torch
def test_mixed_backends_are_refused() -> None:
    torch = pytest.importorskip("torch", reason="needs the torch extra")
    old = np.zeros((2, 3), np.uint16)
    new = old.copy()
    with pytest.raises(ConfigError, match="new is a torch tensor but old is a numpy one"):
        encode(as_torch(new), old=old, version=1, base_version=0)
    with pytest.raises(ConfigError, match=r"torch\.bfloat16 or torch\.float32"):
        encode(torch.zeros(3, dtype=torch.float64), version=1)


@pytest.mark.torch
@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.uint32, hnp.array_shapes(max_side=40), elements=st.integers(0, 2**32 - 1)))
def test_float32_to_bf16_matches_torch_except_nan(raw: np.ndarray) -> None:
    torch = pytest.importorskip("torch", reason="needs the torch extra")
    x = raw.view(np.float32)
    ours = float32_to_bf16_bits(x)
    theirs = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy()
    keep = ~np.isnan(x)
    assert np.array_equal(ours[keep], theirs.view(np.uint16)[keep])


@st.composite
def float32_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    """`(old, new, nnz)` float32 arrays (raw bit patterns: NaNs, ±0 and subnormals too)."""
    old_bits, new_bits, nnz = draw(weight_pairs())
    widen = np.uint32(0x10001)  # each 16-bit pattern in both halves: every float32 class
    return (
        (old_bits.astype(np.uint32) * widen).view(np.float32),
        (new_bits.astype(np.uint32) * widen).view(np.float32),
        nnz,
    )


@settings(max_examples=100, deadline=None)
@given(float32_pairs(), thresholds)
def test_float32_round_trips_bit_exact_and_sized_by_formula(
    pair: tuple[np.ndarray, np.ndarray, int], threshold: float
) -> None:
    old, new, nnz = pair
    blob = encode(new, old=old, version=4, base_version=3, dense_threshold=threshold)
    sparse = read_header(blob).encoding is Encoding.SPARSE
    assert len(blob) == header_nbytes(new.ndim) + (8 * nnz if sparse else 4 * new.size)
    assert len(blob) == encoded_nbytes(
        new.shape, nnz, dense_threshold=threshold, dtype=read_header(blob).dtype
    )
    out = apply(blob, old, current_version=3)
    assert out.dtype == np.float32 and np.array_equal(out.view(np.uint32), new.view(np.uint32))
    assert count_changed(new, old) == nnz
    dense = decode(encode(new, version=4))
    assert np.array_equal(dense.view(np.uint32), new.view(np.uint32))


@pytest.mark.torch
@pytest.mark.parametrize("kernels", [False, True], ids=["numpy-kernels", "torch-kernels"])
def test_float32_torch_parameters_take_deltas_in_place(kernels: bool) -> None:
    torch = pytest.importorskip("torch", reason="needs the torch extra")
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(6, 8, generator=gen)
    new = old.clone()
    new[1:3, 2:5] += 0.001
    with torch_kernels(kernels):
        blob = encode(new, old=old, version=1, base_version=0)
        assert blob == encode(new.numpy(), old=old.numpy(), version=1, base_version=0)
        assert read_header(blob).nnz == 6
        weight = torch.nn.Parameter(old.clone())
        apply(blob, weight, current_version=0, inplace=True)
        assert torch.equal(weight.detach(), new)
        assert torch.equal(decode(encode(new, version=1), backend="torch"), new)
