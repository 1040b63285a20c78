"""Compressed messages: parameter values sent in fewer bytes, with error feedback, merged in float32.

`--compress` picks the format every value travels in:
    fp16: IEEE half (2 bytes; 11 significant bits, so about 5e-4 of each value; |x| > 65504 is
          clipped): half the bytes at an error far below an SGD step's.
    bf16: bfloat16 (2 bytes; float32's range, 8 significant bits: 4e-3 of each value).
    int8: 1 byte per value and a float32 scale per block of BLOCK values (max |x| / 127 of the
          block): a quarter of the bytes, an error up to 1/254 of the block's largest value.
Error feedback: each peer keeps, per element, what compression took off the last value it sent
(sent = compress(x + residual), residual = x + residual - sent), so an error made in one round is
sent in the next instead of being lost, and the errors do not add up over rounds. The receiver
reads the values in the format they came in (`native/merge.c`) and averages in float32 or wider,
so the only loss of precision is the sender's rounding.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from p2plearn.sync.bfloat16 import BF16Array, bf16_values, store, values
from p2plearn.sync.merge import Contribution
from p2plearn.transport.delivery import Delivery

MODES = ("none", "fp16", "bf16", "int8")
BLOCK = 256  # int8: values per scale (4 bytes of scale per 256 of values: 1.6% more bytes)
FP16_MAX = 65504.0

Piece = tuple[int, int, int]  # (tensor index, first element, end element) of what one array carries


class Compressor:
    """Encodes a peer's outgoing values and reads compressed messages back as contributions.

    sizes: elements of each tensor (one residual per element, float32, kept across rounds).
    """

    def __init__(self, mode: str, sizes: list[int]):
        if mode not in MODES[1:]:
            raise ValueError(f"compression must be one of {', '.join(MODES[1:])}, got {mode!r}")
        self.mode = mode
        self.residuals = [np.zeros(n, dtype=np.float32) for n in sizes]

    def encode(self, pieces: list[np.ndarray], at: list[Piece]) -> list[np.ndarray]:
        """The arrays that carry `pieces` (flat parameter values; piece i is elements at[i] of its
        tensor): one per piece, and for int8 one scale array per piece after them."""
        sent, scales = [], []
        for piece, (t, a, b) in zip(pieces, at):
            residual = self.residuals[t][a:b]
            x = values(piece).reshape(-1).astype(np.float32) + residual
            wire, decoded = self._quantize(x)
            np.subtract(x, decoded, out=residual)
            sent.append(wire[0])
            scales.extend(wire[1:])
        return sent + scales

    def _quantize(self, x: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        if self.mode == "fp16":
            half = np.clip(x, -FP16_MAX, FP16_MAX).astype(np.float16)
            return [half], half.astype(np.float32)
        if self.mode == "bf16":
            bits = np.zeros(x.size, dtype=np.uint16).view(BF16Array)
            store(bits, x)
            return [np.asarray(bits)], values(bits)
        blocks = np.zeros(-(-x.size // BLOCK) * BLOCK, dtype=np.float32)
        blocks[:x.size] = x
        blocks = blocks.reshape(-1, BLOCK)
        scale = np.abs(blocks).max(axis=1) / 127.0
        scale[scale == 0] = 1.0
        q = np.rint(blocks / scale[:, None]).astype(np.int8)
        return [q.reshape(-1)[:x.size], scale.astype(np.float32)], (q * scale[:, None]).reshape(-1)[:x.size]

    def wire_bytes(self, sizes: list[int]) -> int:
        """The bytes that carry tensors of `sizes` elements."""
        if self.mode == "int8":
            return sum(n + 4 * -(-n // BLOCK) for n in sizes)
        return 2 * sum(sizes)

    def loss_bounds(self, bounds: list[float]) -> list[float]:
        """Per-array loss bounds from per-piece ones (int8 scales must all arrive: they are tiny,
        and without its scale a block is lost whole)."""
        return list(bounds) + ([0.0] * len(bounds) if self.mode == "int8" else [])

    def contributions(self, d: Delivery, sizes: list[int]) -> list[Contribution] | None:
        """What d brings for pieces of `sizes` elements, or None when its arrays are not such a
        message (another format or model, or malformed)."""
        if d.arrays is None:
            return None
        n = len(sizes)
        wanted = {"fp16": [np.float16], "bf16": [np.uint16], "int8": [np.int8, np.float32]}[self.mode]
        if len(d.arrays) != n * len(wanted):
            return None
        for k, dtype in enumerate(wanted):
            for i, size in enumerate(sizes):
                a = d.arrays[k * n + i]
                if a.dtype != dtype or a.ndim != 1 or a.size != (size if k == 0 else -(-size // BLOCK)):
                    return None
        out = []
        for i in range(n):
            mask = None
            if self.mode == "int8" and d.fractions[n + i] < 1.0:  # blocks whose scale was lost count as lost
                mask = np.repeat(d.element_mask(n + i), BLOCK)[:sizes[i]]
            out.append(Contribution(d.arrays[i], mask, d.chunks(i),
                                    scales=d.arrays[n + i] if self.mode == "int8" else None, block=BLOCK))
        return out

    def decode(self, c: Contribution, like: np.ndarray) -> np.ndarray:
        """c's values as numbers of `like`'s dtype (bfloat16 bits for a BF16Array)."""
        if self.mode == "fp16":
            x = c.values.astype(np.float32)
        elif self.mode == "bf16":
            x = bf16_values(c.values)
        else:
            x = c.values * np.repeat(c.scales, BLOCK)[:c.values.size]
        out = np.empty(like.shape, like.dtype).view(type(like))
        store(out, x.reshape(like.shape))
        return np.asarray(out)

    def state_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "residuals": [r.copy() for r in self.residuals]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["mode"] != self.mode or [r.size for r in state["residuals"]] != [r.size for r in self.residuals]:
            raise ValueError(f"the state is of --compress {state['mode']} on tensors of "
                             f"{[r.size for r in state['residuals']]} elements, not this run's")
        self.residuals = [np.array(r, dtype=np.float32) for r in state["residuals"]]
