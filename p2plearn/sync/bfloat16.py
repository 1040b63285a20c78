"""bfloat16 in numpy, which has no such dtype: the bits travel and are stored as uint16, and
every computation on them goes through float32.

A bfloat16 parameter reaches the synchronizer as a `BF16Array` (a uint16 view of the tensor's
memory that says what it holds); `values` gives the float32 values of any parameter, and `store`
writes float values into one, rounding to nearest even as torch does.
"""
from __future__ import annotations

import numpy as np


class BF16Array(np.ndarray):
    """The raw bits of bfloat16 values, as uint16 (make one with ``bits.view(BF16Array)``)."""


def values(a: np.ndarray) -> np.ndarray:
    """The numbers `a` holds: float32 for a BF16Array (exact), `a` itself otherwise."""
    if isinstance(a, BF16Array):
        return (np.asarray(a).astype(np.uint32) << 16).view(np.float32)
    return a


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """float32 values of received bfloat16 bits (plain uint16, as the transport hands them over)."""
    return values(np.asarray(bits).view(BF16Array))


def store(own: np.ndarray, new: np.ndarray) -> None:
    """own[...] = new, in own's dtype; a BF16Array gets the bfloat16 nearest to each value."""
    if not isinstance(own, BF16Array):
        own[...] = new
        return
    x = np.ascontiguousarray(new, dtype=np.float32)
    u = x.view(np.uint32)
    bits = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)  # round to nearest, ties to even
    bits[np.isnan(x)] = 0x7FC0                                            # NaN stays NaN
    np.asarray(own)[...] = bits
