"""bfloat16 without torch: numpy holds a bf16 tensor as a `uint16` array of its raw bits.

A bf16 value is the upper half of the float32 with the same sign and exponent, so widening is
exact (`bits << 16`) and narrowing rounds the lower 16 bits away, to nearest with ties to even.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from loom.core.errors import ConfigError

__all__ = ["BF16_BITS_DTYPE", "bf16_bits_to_float32", "float32_to_bf16_bits"]

BF16_BITS_DTYPE = np.dtype(np.uint16)
_QUIET_NAN = np.uint16(0x7FC0)
_SIGN = np.uint16(0x8000)


def float32_to_bf16_bits(values: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """Raw bf16 bits of `values` (cast to float32 first), rounded to nearest, ties to even.

    This is `c10::BFloat16`'s rounding: overflow goes to ±inf, float32 subnormals become bf16
    subnormals or ±0 (no flush), ±0 and ±inf keep their sign. A NaN becomes the quiet NaN
    0x7FC0 with its sign kept (0xFFC0), as `ml_dtypes.bfloat16` does. NOTE: torch's own casts
    disagree on NaN (its scalar path gives 0x7FC0, its vectorised CPU kernel 0xFFFF), so only
    non-NaN values are guaranteed to match `tensor.to(torch.bfloat16)`.
    """
    x = np.asarray(values, dtype=np.float32)
    u = x.view(np.uint32)
    # uint32 wrap-around only happens for NaN bit patterns, which are replaced below.
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        sign = (u >> 16).astype(np.uint16) & _SIGN
        rounded = np.where(nan, sign | _QUIET_NAN, rounded)
    return rounded


def bf16_bits_to_float32(bits: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """The float32 values of raw bf16 bits; exact, NaN payloads included."""
    b = np.asarray(bits)
    if b.dtype != BF16_BITS_DTYPE:
        raise ConfigError(f"bf16 bits must be a uint16 array, got dtype {b.dtype}")
    return (b.astype(np.uint32) << 16).view(np.float32)
