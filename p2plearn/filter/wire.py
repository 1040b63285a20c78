"""The filtered update's wire format: plain numpy arrays that travel as engine segments.

arrays[0] is the header, int32 of one code per model layer: ABSENT (nothing sent), DENSE or SPARSE.
Then, for each layer in order: DENSE -> its float32 values (all elements, flattened);
SPARSE -> an int32 array of flat indices, then a float32 array of the values at those indices.
Absent layers have no arrays, so no segment is ever empty.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

ABSENT, DENSE, SPARSE = 0, 1, 2

# What a filter hands to `pack` per layer: None, dense values, or (indices, values).
Entry = Union[None, np.ndarray, tuple[np.ndarray, np.ndarray]]


@dataclass
class EncodedUpdate:
    """One peer's message for one round.

    arrays: what to pass to `Channel.send` (header first).
    layer_of: per array, the model layer it belongs to (-1 for the header).
    exact: per array, whether it must arrive whole (the header and index arrays: a lost chunk
        there would misplace values); value arrays may be lossy.
    dense_bytes: bytes the unfiltered dense update would take.
    """

    arrays: list[np.ndarray]
    layer_of: list[int]
    exact: list[bool]
    dense_bytes: int

    @property
    def sent_bytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays))

    @property
    def present(self) -> list[int]:
        """Indices of the layers this message carries."""
        return [int(i) for i in np.flatnonzero(self.arrays[0] != ABSENT)]

    def wire_bounds(self, layer_bounds: Sequence[float]) -> list[float]:
        """Per-array loss bounds for `Channel.send`, from the tolerance policy's per-layer bounds."""
        return [0.0 if ex else float(layer_bounds[layer]) for layer, ex in zip(self.layer_of, self.exact)]


def pack(entries: list[Entry], dense_bytes: int) -> EncodedUpdate:
    """The message for per-layer entries: None (absent), values (dense) or (indices, values) (sparse)."""
    header = np.zeros(len(entries), dtype=np.int32)
    arrays, layer_of, exact = [header], [-1], [True]
    for i, e in enumerate(entries):
        if e is None:
            continue
        if isinstance(e, tuple):
            header[i] = SPARSE
            arrays += [e[0].astype(np.int32, copy=False), e[1].astype(np.float32, copy=False)]
            layer_of += [i, i]
            exact += [True, False]
        else:
            header[i] = DENSE
            arrays.append(e.astype(np.float32, copy=False))
            layer_of.append(i)
            exact.append(False)
    return EncodedUpdate(arrays, layer_of, exact, dense_bytes)


def layout(arrays: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]],
           complete: Sequence[bool] | None = None) -> list[tuple[int, int | None, int | None]]:
    """Per layer: (code, position of its index array or None, position of its values or None),
    after checking the message against the model's shapes.

    complete: per array, whether it arrived whole; a sparse layer whose index array is incomplete
        comes back ABSENT (its values cannot be placed). Raises ValueError on a malformed message
        or an incomplete header: the caller should treat the message as lost.
    """
    if complete is not None and len(complete) != len(arrays):
        raise ValueError(f"{len(complete)} completeness flags for {len(arrays)} arrays")
    if not arrays or (complete is not None and not complete[0]):
        raise ValueError("message without a (complete) header")
    header = np.asarray(arrays[0])
    if header.dtype != np.int32 or header.shape != (len(shapes),):
        raise ValueError(f"header must be int32 of {len(shapes)} layer codes, got {header.dtype} {header.shape}")
    if not np.isin(header, (ABSENT, DENSE, SPARSE)).all():
        raise ValueError("header holds an unknown layer code")
    expected = 1 + int((header == DENSE).sum() + 2 * (header == SPARSE).sum())
    if len(arrays) != expected:
        raise ValueError(f"header announces {expected} arrays, message has {len(arrays)}")
    out: list[tuple[int, int | None, int | None]] = []
    k = 1
    for code, shape in zip(header, shapes):
        numel = int(np.prod(shape))
        if code == DENSE:
            if np.asarray(arrays[k]).size != numel:
                raise ValueError(f"dense layer of {numel} elements got {np.asarray(arrays[k]).size} values")
            out.append((DENSE, None, k))
            k += 1
        elif code == SPARSE:
            idx, values = np.asarray(arrays[k]).reshape(-1), np.asarray(arrays[k + 1]).reshape(-1)
            if idx.dtype != np.int32 or idx.size != values.size:
                raise ValueError(f"sparse layer needs int32 indices and as many values, got {idx.dtype} "
                                 f"{idx.size} and {values.size}")
            if complete is None or complete[k]:
                if idx.size and (idx.min() < 0 or idx.max() >= numel):
                    raise ValueError(f"sparse index out of range for a layer of {numel} elements")
                out.append((SPARSE, k, k + 1))
            else:
                out.append((ABSENT, None, None))
            k += 2
        else:
            out.append((ABSENT, None, None))
    return out


def decode(arrays: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]],
           complete: Sequence[bool] | None = None) -> list[np.ndarray]:
    """Dense float32 updates of the given shapes from a received message (zeros where nothing was sent).

    complete: as for `layout`. Lost chunks of value arrays must hold zeros (the engine's
    default), meaning "no change" for those elements. Raises ValueError like `layout`.
    """
    out = []
    for (code, idx, values), shape in zip(layout(arrays, shapes, complete), shapes):
        dense = np.zeros(int(np.prod(shape)), dtype=np.float32)
        if code == DENSE:
            dense[:] = np.asarray(arrays[values]).reshape(-1)
        elif code == SPARSE:
            dense[np.asarray(arrays[idx]).reshape(-1)] = np.asarray(arrays[values]).reshape(-1)
        out.append(dense.reshape(shape))
    return out
