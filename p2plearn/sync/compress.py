"""Compressed messages: parameter values sent in fewer bytes, with error feedback, merged in float32.

`--compress` picks the format every value travels in:
    fp16: IEEE half (2 bytes; 11 significant bits, so about 5e-4 of each value; |x| > 65504 is
          clipped): half the bytes at an error far below an SGD step's.
    bf16: bfloat16 (2 bytes; float32's range, 8 significant bits: 4e-3 of each value).
    int8: 1 byte per value and a float32 scale per block of BLOCK values (max |x| / 127 of the
          block): a quarter of the bytes, an error up to 1/254 of the block's largest value.
    int4: integers in [-7, 7], two per byte, and a float32 scale per block of BLOCK4 values (max |x| / 7
          of the block): 0.5 + 4 / BLOCK4 bytes per value (14% of float32's), an error up to 1/14 of
          the block's largest value. Meant for what changes over a period (the outer change), where
          error feedback carries each round's error into the next. Byte i holds element 2i in its low
          nibble and 2i + 1 in its high one, each as its integer + 8 (an odd count leaves the last
          high nibble 8, a zero); see `pack_int4`.
Error feedback: each peer keeps, per element, what compression took off the last value it sent
(sent = compress(x + residual), residual = x + residual - sent), so an error made in one round is
sent in the next instead of being lost, and the errors do not add up over rounds. The sender
encodes in C (`native/quantize.c`: one pass per piece, into arrays kept across rounds); the receiver
reads the values in the format they came in (`native/merge.c`) and averages in float32 or wider,
so the only loss of precision is the sender's rounding.
Non-finite values: what a receiver reads of a message is refused where it would be NaN or inf (a
value that is not finite; an int8 or int4 block whose scale is not finite or would read a code past
float32's range) and counts as not arrived, there only, as a lost chunk does; `keep_nonfinite`
merges them as they come (a diverging peer's NaN then spreads, as it would uncompressed).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from p2plearn.compute import check, ffi, lib
from p2plearn.sync.bfloat16 import BF16Array, store
from p2plearn.sync.merge import Contribution
from p2plearn.sync.reused import ReusedArrays
from p2plearn.transport.delivery import Delivery

MODES = ("none", "fp16", "bf16", "int8", "int4")
BLOCK = 256  # int8: values per scale (4 bytes of scale per 256 of values: 1.6% more bytes)
# int4: values per scale (4 bytes per 32 of codes: 12.5% more bytes). Measured on the outer change of
# MNIST-1D's CNN and MLP (relative L2 error of one round): 32 errs 14-15% less for 11% more bytes,
# 128 errs 14-18% more for 6% fewer.
BLOCK4 = 64

Piece = tuple[int, int, int]  # (tensor index, first element, end element) of what one array carries
# per mode: the dtypes of the arrays one piece travels in (values, then scales where there are any)
WIRE_DTYPES = {"fp16": [np.float16], "bf16": [np.uint16], "int8": [np.int8, np.float32],
               "int4": [np.uint8, np.float32]}
# per mode, its format in native/quantize.c; per dtype of what is encoded, how quantize.c reads it
_FORMATS = {"fp16": lib.P2P_F16, "bf16": lib.P2P_BF16, "int8": lib.P2P_I8, "int4": lib.P2P_I4}
_SOURCES = {np.dtype(np.float32): lib.P2P_F32, np.dtype(np.float64): lib.P2P_F64, np.dtype(np.float16): lib.P2P_F16}


def pack_int4(q: np.ndarray) -> np.ndarray:
    """Integers in [-8, 7], two per byte: element 2i in the low nibble of byte i, 2i + 1 in the high
    one, each stored as q + 8 (an odd count pads the last high nibble with 8, i.e. 0)."""
    codes = np.full(q.size + (q.size & 1), 8, dtype=np.uint8)
    codes[:q.size] = (q + 8).astype(np.uint8)
    return codes[0::2] | (codes[1::2] << 4)


def unpack_int4(packed: np.ndarray, n: int) -> np.ndarray:
    """The n integers (int8, in [-8, 7]) that `pack_int4` packed."""
    codes = np.empty(2 * packed.size, dtype=np.int8)
    codes[0::2] = packed & 0x0F
    codes[1::2] = packed >> 4
    return codes[:n] - 8


def stored(x: np.ndarray, like: np.ndarray) -> np.ndarray:
    """The numbers x as an array of `like`'s shape and dtype (bfloat16 bits for a BF16Array)."""
    out = np.empty(like.shape, like.dtype).view(type(like))
    store(out, x.reshape(like.shape))
    return np.asarray(out)


class Compressor:
    """Encodes a peer's outgoing values and reads compressed messages back as contributions.

    sizes: elements of each tensor (one residual per element, float32, kept across rounds); None:
    no error feedback (each message rounded on its own; `encode` then ignores `at`).
    keep_nonfinite: read NaN and inf values (and scales that make them) as they come; by default
    they count as not arrived (`Contribution.finite_only`).
    """

    def __init__(self, mode: str, sizes: list[int] | None, keep_nonfinite: bool = False):
        if mode not in MODES[1:]:
            raise ValueError(f"compression must be one of {', '.join(MODES[1:])}, got {mode!r}")
        self.mode = mode
        self.keep_nonfinite = keep_nonfinite
        self.residuals = None if sizes is None else [np.zeros(n, dtype=np.float32) for n in sizes]
        self._reused = ReusedArrays()  # what encode writes, kept across rounds

    def encode(self, pieces: list[np.ndarray], at: list[Piece], decoded: list[np.ndarray] | None = None,
               residuals: list[np.ndarray] | None = None, anchors: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """The arrays that carry `pieces` (flat parameter values; piece i is elements at[i] of its
        tensor): one per piece, and for int8 and int4 one scale array per piece after them.
        `decoded`, when given, gets what a receiver reads of each piece (float32). `residuals`, when
        given, is each piece's error feedback (float32 of its size, updated in place) instead of this
        compressor's own (a partitioned aggregator keeps its part's, `PartFeedback`). `anchors`, when
        given, holds per piece a float32 array of its size (the pieces float32 too): each piece travels
        as its change since its anchor, piece - anchor, computed in the same pass.

        Each piece is encoded in one pass in C (`native/quantize.c`: its residual added and
        updated there, no temporary its size). The arrays returned are this compressor's own,
        written again by a later `encode` once no one holds them (see `ReusedArrays`): keep them
        referenced while they are read (a channel does until its send is done). Its owner calls
        `settle` once a round."""
        sent, scales = [], []
        for i, (piece, (t, a, b)) in enumerate(zip(pieces, at)):
            if residuals is not None:
                residual = residuals[i]
            else:
                residual = self.residuals[t][a:b] if self.residuals is not None else None
            wire, read = self._quantize(piece, residual, decoded is not None, anchors[i] if anchors else None)
            if decoded is not None:
                decoded.append(read)
            sent.append(wire[0])
            scales.extend(wire[1:])
        return sent + scales

    def settle(self) -> None:
        """The end of a round: the encoded arrays that no `encode` since the last call handed out,
        and that no one holds, go. Once a round, not once an `encode`: a partitioned scatter encodes
        once per aggregator, and settling after each let the round's other arrays go, to be
        allocated (and their pages zeroed) anew the next round."""
        self._reused.settle()

    def forget(self, at: list[Piece]) -> None:
        """Drop the error feedback of the pieces `at` (what they held was sent some other way)."""
        for t, a, b in at:
            self.residuals[t][a:b] = 0.0

    def _quantize(self, piece: np.ndarray, residual: np.ndarray | None, read: bool,
                  anchor: np.ndarray | None = None) -> tuple[list[np.ndarray], np.ndarray | None]:
        """The arrays that carry one piece (less `anchor` when given; with error feedback into
        `residual`, float32 of its size, when given), and what a receiver reads of it when `read`."""
        if isinstance(piece, BF16Array):
            source, dtype = np.ascontiguousarray(piece).view(np.uint16).reshape(-1), lib.P2P_BF16
        elif np.dtype(piece.dtype) in _SOURCES:
            source = np.ascontiguousarray(piece).reshape(-1)
            dtype = _SOURCES[source.dtype]
        else:  # any other dtype (integers): as float32, as numpy would add it to the residual
            source, dtype = np.ascontiguousarray(piece, dtype=np.float32).reshape(-1), lib.P2P_F32
        n, block = source.size, self.block
        if residual is not None and residual.size != n:
            raise ValueError(f"a piece of {n} elements with a residual of {residual.size}")
        job = ffi.new("p2p_quantize_job *")
        job.values, job.values_bytes, job.dtype = ffi.from_buffer(source), source.nbytes, dtype
        codes = self._reused.take(-(-n // 2) if self.mode == "int4" else n, WIRE_DTYPES[self.mode][0])
        job.format, job.codes, job.codes_bytes = _FORMATS[self.mode], ffi.from_buffer(codes), codes.nbytes
        wire = [codes]
        if block:
            wire.append(self._reused.take(-(-n // block), np.float32))
            job.scales, job.nscales, job.block = ffi.from_buffer("float[]", wire[1]), wire[1].size, block
        if residual is not None:
            job.residual, job.nresidual = ffi.from_buffer("float[]", residual), n
        if anchor is not None:
            job.anchor, job.nanchor = ffi.from_buffer("float[]", anchor), anchor.size
        decoded = self._reused.take(n, np.float32) if read else None
        if decoded is not None:
            job.decoded, job.ndecoded = ffi.from_buffer("float[]", decoded), n
        check(lib.p2p_quantize(job, n))
        return wire, decoded

    @property
    def block(self) -> int:
        """Values per scale (0: the mode has no scales)."""
        return {"int8": BLOCK, "int4": BLOCK4}.get(self.mode, 0)

    def wire_bytes(self, sizes: list[int]) -> int:
        """The bytes that carry tensors of `sizes` elements."""
        if self.mode == "int8":
            return sum(n + 4 * -(-n // BLOCK) for n in sizes)
        if self.mode == "int4":
            return sum(-(-n // 2) + 4 * -(-n // BLOCK4) for n in sizes)
        return 2 * sum(sizes)

    def loss_bounds(self, bounds: list[float]) -> list[float]:
        """Per-array loss bounds from per-piece ones (int8 and int4 scales must all arrive: they
        are few, and without its scale a block is lost whole)."""
        return list(bounds) + ([0.0] * len(bounds) if self.block else [])

    def contributions(self, d: Delivery, sizes: list[int]) -> list[Contribution] | None:
        """What d brings for pieces of `sizes` elements, or None when its arrays are not such a
        message (another format or model, or malformed)."""
        if d.arrays is None:
            return None
        n, wanted, block = len(sizes), WIRE_DTYPES[self.mode], self.block
        if len(d.arrays) != n * len(wanted):
            return None
        for k, dtype in enumerate(wanted):
            for i, size in enumerate(sizes):
                a = d.arrays[k * n + i]
                length = -(-size // block) if k else -(-size // 2) if self.mode == "int4" else size
                if a.dtype != dtype or a.ndim != 1 or a.size != length:
                    return None
        return [self._contribution(d, i, n, size) for i, size in enumerate(sizes)]

    def _contribution(self, d: Delivery, i: int, n: int, size: int) -> Contribution:
        """Piece i (of n, `size` elements) of d: its values, with the elements of lost chunks and
        of blocks whose scale was lost marked as lost."""
        finite_only = not self.keep_nonfinite
        if not self.block:
            return Contribution(d.arrays[i], chunks=d.chunks(i), finite_only=finite_only)
        lost_scales = d.fractions[n + i] < 1.0
        scale_mask = np.repeat(d.element_mask(n + i), self.block)[:size] if lost_scales else None
        if self.mode == "int8":
            return Contribution(d.arrays[i], scale_mask, d.chunks(i), scales=d.arrays[n + i], block=BLOCK,
                                finite_only=finite_only)
        # int4: an element mask, not the chunk mask, as a byte (one mask entry) holds two elements;
        # who reads the mask (the merge, a partitioned gather) then needs no int4 layout
        mask = np.repeat(d.element_mask(i), 2)[:size] if d.fractions[i] < 1.0 else None
        if scale_mask is not None:
            mask = scale_mask if mask is None else mask & scale_mask
        return Contribution(d.arrays[i], mask, scales=d.arrays[n + i], block=BLOCK4, finite_only=finite_only)

    def state_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "residuals": [r.copy() for r in self.residuals or []]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["mode"] != self.mode or [r.size for r in state["residuals"]] != [r.size for r in self.residuals or []]:
            raise ValueError(f"the state is of --compress {state['mode']} on tensors of "
                             f"{[r.size for r in state['residuals']]} elements, not this run's")
        self.residuals = [np.array(r, dtype=np.float32) for r in state["residuals"]]
