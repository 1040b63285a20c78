"""Zero-copy views between tensors/arrays and engine memory, and the descriptor that travels with a message.

The descriptor (dtype and shape of each array) rides in the engine's opaque `app` blob so that a
receiver can rebuild typed arrays without knowing the sender's model in advance.
"""
from __future__ import annotations

import json
import math
from typing import Any, Sequence

import numpy as np


def as_numpy(x: Any) -> np.ndarray:
    """A numpy view of a numpy array or CPU torch tensor, sharing its memory (never a copy)."""
    if hasattr(x, "detach") and hasattr(x, "is_contiguous"):  # torch.Tensor, without importing torch
        if x.device.type != "cpu":
            raise ValueError(f"tensor on {x.device}: only CPU tensors can be sent without a copy")
        if not x.is_contiguous():
            raise ValueError("tensor is not contiguous: call .contiguous() first (that copies)")
        return x.detach().numpy()
    a = np.asarray(x)
    if not a.flags.c_contiguous:
        raise ValueError("array is not C-contiguous: use np.ascontiguousarray first (that copies)")
    return a


def encode_descriptor(arrays: Sequence[np.ndarray]) -> bytes:
    return json.dumps([[a.dtype.str, list(a.shape)] for a in arrays], separators=(",", ":")).encode()


def message_bytes(arrays: Sequence[np.ndarray]) -> int:
    """The bytes a message of these arrays claims at its receiver (meta with the descriptor, then
    each array 8-byte aligned, as the engine lays them out). A receiver whose ``max_message_bytes``
    is at least this takes the message. Reads only dtypes and shapes: size a message that is never
    made with zero-stride views, e.g. ``np.broadcast_to(np.float32(0), shape)``."""
    size = (24 + 24 * len(arrays) + len(encode_descriptor(arrays)) + 7) // 8 * 8
    for a in arrays:
        size = (size + 7) // 8 * 8 + a.nbytes
    return size


# The dtypes a descriptor may name: numeric ones, as `encode_descriptor` writes them (an object or
# structured dtype from the network would be read as pointers; a name outside the list never reaches np.dtype).
NUMERIC_DTYPES = frozenset(np.dtype(code).newbyteorder(order).str
                           for code in "?" + np.typecodes["AllInteger"] + np.typecodes["AllFloat"] for order in "<>")
MAX_DIMS = 32  # numpy's own limit
# A zero-size array's other dimensions still count for numpy, which refuses a shape whose nonzero
# dimensions overflow its index type; no real array comes near this, and numpy makes any shape below it.
MAX_SHAPE_BYTES = 1 << 48


def decode_descriptor(blob: bytes, seg_lens: Sequence[int]) -> list[tuple[np.dtype, tuple[int, ...]]] | None:
    """The (dtype, shape) list, or None when the blob is not a descriptor of numeric arrays whose
    sizes are exactly ``seg_lens`` bytes and that numpy can make (the blob comes from the network:
    anything may be in it; whatever this returns, `np.ndarray(shape, dtype, buffer)` works)."""
    try:
        items = json.loads(blob.decode())
    except (ValueError, RecursionError):  # bad UTF-8 or JSON, an int past the digit limit; too deep
        return None
    if not isinstance(items, list) or len(items) != len(seg_lens):
        return None
    out = []
    for item, nbytes in zip(items, seg_lens):
        if not isinstance(item, list) or len(item) != 2:
            return None
        name, shape = item
        if not isinstance(name, str) or name not in NUMERIC_DTYPES or not isinstance(shape, list):
            return None
        if len(shape) > MAX_DIMS or any(type(n) is not int or n < 0 for n in shape):
            return None
        dtype = np.dtype(name)
        if math.prod(shape) * dtype.itemsize != nbytes:
            return None
        if math.prod(n for n in shape if n) * dtype.itemsize > MAX_SHAPE_BYTES:
            return None
        out.append((dtype, tuple(shape)))
    return out


class EngineMemory:
    """Exposes engine-owned bytes to numpy while keeping their owner (a C delivery) alive."""

    def __init__(self, owner: Any, address: int, nbytes: int):
        self._owner = owner
        self.__array_interface__ = {"data": (address, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}
