"""The size of a model's change since the last round, in C (`native/change.c`): what the tolerance
policies read as each layer's update norm, measured in one read-only pass over the tensor and its
anchor (no temporary the size of the model, no float64 copy of it)."""
from __future__ import annotations

import math

import numpy as np

from p2plearn.compute import check, ffi, lib
from p2plearn.sync.merge import _code


def change_norm(now: np.ndarray, before: np.ndarray) -> float:
    """The L2 norm of ``now - before`` (two C-contiguous arrays of the same size and dtype: float32,
    float64, float16 or bfloat16 bits), summed in double."""
    if now.size != before.size or now.dtype != before.dtype:
        raise ValueError(f"the change between {now.size} {now.dtype} and {before.size} {before.dtype} elements")
    out = ffi.new("double *")
    check(lib.p2p_change_sumsq(ffi.from_buffer(np.asarray(now)), ffi.from_buffer(np.asarray(before)),
                               _code(now), now.size, out))
    return math.sqrt(out[0])
