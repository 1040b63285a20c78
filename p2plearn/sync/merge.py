"""Mask-aware averaging, in place and vectorised.

Each element of a parameter becomes the mean of the receiver's own value and the values that
arrived for it; a sender whose chunk was lost does not count for that element, so a lost
chunk never drags a parameter towards zero (or anywhere else).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from p2plearn.sync.bfloat16 import BF16Array, bf16_values, store, values


@dataclass
class Contribution:
    """One sender's values for one parameter; mask None = every element arrived."""

    values: np.ndarray
    mask: np.ndarray | None = None


def merge_parameter(own: np.ndarray, contributions: list[Contribution]) -> float:
    """Average `own` in place with the contributions (in float64; a bfloat16 `own` takes values
    as sent, bfloat16 bits, or float32); returns the fraction of (element, sender) pairs that
    arrived."""
    if not contributions:
        return 1.0
    total = values(own).astype(np.float64)
    count = np.ones(own.shape, dtype=np.float64)
    arrived = 0.0
    for c in contributions:
        sent = bf16_values(c.values) if isinstance(own, BF16Array) and c.values.dtype == np.uint16 else c.values
        if c.mask is None:
            total += sent
            count += 1.0
            arrived += 1.0
        else:
            np.add(total, sent, out=total, where=c.mask)
            count += c.mask
            arrived += float(c.mask.mean()) if c.mask.size else 1.0
    np.divide(total, count, out=total)
    store(own, total)
    return arrived / len(contributions)
