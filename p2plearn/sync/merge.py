"""Mask-aware averaging, in place, in C (`native/merge.c`).

Each element of a parameter becomes the mean of the receiver's own value and the values that
arrived for it; a sender whose chunk was lost does not count for that element, so a lost
chunk never drags a parameter towards zero (or anywhere else). What arrived is read straight
from the message's chunk mask (no per-element mask is built), and the values are read in the
dtype they travelled in (float32/64, float16, bfloat16 bits, or int8 or packed int4 times a scale
per block). A contribution marked finite_only (what `Compressor` reads off the network) refuses, in
the same pass, a value that is not finite and a block whose scale would read as one: a member's NaN
or inf counts as not arrived there, instead of spreading to every model.
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from p2plearn.sync.bfloat16 import BF16Array
from p2plearn.compute import check, ffi, lib
from p2plearn.sync.reused import ReusedArrays
from p2plearn.transport.delivery import ChunkMask

EARLY_SENDERS = 3  # expected senders from which `OrderedFolds` folds before the end (see its doc)
_DTYPES = {np.dtype(np.float32): lib.P2P_F32, np.dtype(np.float64): lib.P2P_F64,
           np.dtype(np.float16): lib.P2P_F16, np.dtype(np.int8): lib.P2P_I8, np.dtype(np.uint8): lib.P2P_I4}


@dataclass
class Contribution:
    """One sender's values for one parameter.

    mask: per element, True where it arrived; chunks: what arrived, per chunk of the message that
    carried `values`; None for both = every element arrived. values of dtype uint16 are bfloat16
    bits; int8 values stand for values[e] * scales[e // block] (block 0: one scale for all); uint8
    values are int4 codes, two per byte (`p2plearn.sync.compress.pack_int4`), scaled the same way.
    finite_only: refuse a value that is not finite, and every value of a block whose scale is not
    finite or would read a code past float32's range (|scale| x 128 for int8, x 8 for int4): they
    count as not arrived. nonfinite: how many of its values that arrived the last `merge_parameter`
    or `decode` refused so (set by them).
    """

    values: np.ndarray
    mask: np.ndarray | None = None
    chunks: ChunkMask | None = None
    scales: np.ndarray | None = None
    block: int = 0
    finite_only: bool = False
    nonfinite: int = 0


def _code(a: np.ndarray) -> int:
    if isinstance(a, BF16Array) or a.dtype == np.uint16:
        return lib.P2P_BF16
    try:
        return _DTYPES[a.dtype]
    except KeyError:
        raise TypeError(f"cannot merge values of dtype {a.dtype}") from None


def _packed(values: np.ndarray) -> bool:
    """Whether values are int4 codes, two per byte."""
    return values.dtype == np.uint8


def unfit(own: np.ndarray, c: Contribution) -> str | None:
    """Why `c` cannot be merged into `own` (its values come from the network: a peer's bug or a
    hostile key holder), or None when it can."""
    if c.values.size != (-(-own.size // 2) if _packed(c.values) else own.size):
        what = "int4 pairs" if _packed(c.values) else "elements"
        return f"a contribution of {c.values.size} {what} for a parameter of {own.size} elements"
    if c.values.dtype not in _DTYPES and c.values.dtype != np.uint16:
        return f"values of dtype {c.values.dtype}"
    block = c.block or max(own.size, 1)
    if c.values.dtype in (np.int8, np.uint8) and (c.scales is None or c.scales.size != -(-own.size // block)):
        return f"{'int4' if _packed(c.values) else 'int8'} values need {-(-own.size // block)} scales " \
               f"(one per {block} values)"
    if c.mask is not None and c.mask.size != own.size:
        return f"a mask of {c.mask.size} elements for a parameter of {own.size}"
    if c.chunks is not None and own.size:
        last_byte = c.chunks.first_byte + c.values.nbytes - 1
        if c.chunks.chunk_size <= 0 or c.chunks.first_byte < 0 or \
                last_byte // c.chunks.chunk_size >= c.chunks.arrived.size:
            return f"values reaching past their message's {c.chunks.arrived.size} chunks"
    return None


def merge_parameter(own: np.ndarray, contributions: list[Contribution]) -> float:
    """Average `own` in place with the contributions; returns the fraction of (element, sender)
    pairs that arrived (and were not refused), and sets each contribution's `nonfinite`. ValueError
    (TypeError for its dtype), before anything changes, for a contribution that is `unfit`; the C
    merge checks the same again."""
    if not contributions:
        return 1.0
    own_code = _target_code(own)
    structs, keep = _structs(own, contributions)
    fraction = ffi.new("double *")
    refused = ffi.new("uint64_t[]", len(contributions))
    check(lib.p2p_merge(ffi.from_buffer(own), own_code, own.size, structs, len(contributions), fraction, refused))
    for c, count in zip(contributions, refused):
        c.nonfinite = int(count)
    return fraction[0]


def nonfinite(contributions: list[Contribution | None]) -> int:
    """How many values the last merge or decode of these contributions refused as not finite."""
    return sum(c.nonfinite for c in contributions if c is not None)


class MergeFold:
    """One tensor's merge taken as its senders' contributions come: `merge_parameter` over several
    calls (`native/merge.c`'s p2p_merge_fold). `add` folds contributions into running sums kept
    here; `finish` averages ``own`` with everything added, in place, and returns the fraction that
    arrived. Contributions added in the order `merge_parameter` would take them give the same bits
    (`OrderedFolds` keeps one order whatever the arrival order).

    ``own`` is read when its blocks are first added to and written only by `finish`, so a send may
    still be reading it until then. The sums (two doubles per element, of which the second is
    touched only where chunks were lost) come from ``scratch`` (arrays kept across rounds; None:
    new ones) at the first `add`: a fold finished without one costs what `merge_parameter` does.
    Not thread-safe; one merge per fold.
    """

    def __init__(self, own: np.ndarray, scratch: ReusedArrays | None = None) -> None:
        self.own = own
        self._own_code = _target_code(own)
        self._scratch = scratch
        self._fold: Any = None     # the C struct, made at the first add
        self._arrays: list[np.ndarray] = []  # what it points into
        self._arrived = 0          # (element, contribution) pairs that arrived, over the calls
        self._added = 0            # contributions added

    def add(self, contributions: list[Contribution]) -> None:
        """Fold the contributions into the sums (sets each one's `nonfinite`); errors as `merge_parameter`'s."""
        if contributions:
            self._call(contributions, finish=False)

    def finish(self, contributions: list[Contribution] = ()) -> float:
        """Add the contributions, then average ``own`` in place with all that was added; the fraction
        of (element, contribution) pairs that arrived over the whole merge (1.0 with none)."""
        contributions = list(contributions)
        if self._fold is None:  # nothing added before: the one-call merge
            return merge_parameter(self.own, contributions)
        self._call(contributions, finish=True)
        return self._arrived / (self.own.size * self._added) if self._added and self.own.size else 1.0

    def _call(self, contributions: list[Contribution], finish: bool) -> None:
        if self._fold is None:
            self._fold = self._make_fold()
        structs, keep = _structs(self.own, contributions)
        arrived = ffi.new("uint64_t *")
        refused = ffi.new("uint64_t[]", max(len(contributions), 1))
        check(lib.p2p_merge_fold(ffi.from_buffer(self.own), self._own_code, self.own.size, self._fold, structs,
                                 len(contributions), int(finish), arrived, refused))
        for c, count in zip(contributions, refused):
            c.nonfinite = int(count)
        self._arrived += arrived[0]
        self._added += len(contributions)

    def _make_fold(self) -> Any:
        n, blocks = self.own.size, -(-self.own.size // lib.P2P_MERGE_BLOCK)
        take = self._scratch.take if self._scratch is not None else (lambda size, dtype: np.empty(size, dtype))
        self._arrays = [take(n, np.float64), take(n, np.float64), take(blocks, np.float64),
                        np.zeros(blocks, dtype=np.uint8)]
        fold = ffi.new("p2p_fold *")
        fold.sum, fold.count, fold.whole = (ffi.from_buffer("double[]", a) for a in self._arrays[:3])
        fold.state = ffi.from_buffer("uint8_t[]", self._arrays[3])
        return fold


class OrderedFolds:
    """The merges of several tensors (``targets``) taking senders' contributions as they come, folded
    in one order whatever the arrival order: the ``expected`` keys in the order given, then any other
    key in sorted order. So each tensor's bits are those of one `merge_parameter` over every
    contribution in that order, however arrivals and `fold_due` calls interleave.

    `offer` a sender's contributions (one per target; None: nothing for that one) when they come;
    `fold_due` folds the offered ones whose expected keys before them are all in; `finish` folds the
    rest and averages each target in place (`MergeFold`: a target is written by `finish` only, so a
    send may still be reading it until then). A partitioned round's aggregator (`PartReduce`, keys:
    its senders) and a BSP or SSP receiver (`Synchronizer`, keys: (round, sender)) merge through it.

    Tuning (``early``: whether `fold_due` folds): a fold before the end costs memory traffic (running
    sums in double: 16 bytes per element read and written per call, against the 4 (float32) a merge
    at the end reads of a contribution) and a double per element of memory, from ``scratch`` (kept
    across rounds). It pays where the receiver would otherwise sit idle waiting on a straggler, and
    costs where its CPU is busy (folding each arrival at once made partitioned loopback rounds slower,
    GPT-2 small and 10 MiB among 4 peers on 2 cores). So the drivers call `fold_due` only when a poll
    of the inbox (`sync.inbox.POLL_S`) brought nothing, and compressed rounds pass ``early=False``:
    their contributions are 0.5-2 bytes per element, so the sums would cost 8-32 times what they
    merge (on GPT-2 small's int4 rounds their memory added 9% to a peer's peak RSS). Nor does a merge
    of fewer than EARLY_SENDERS expected senders fold early: with k float32 senders the merge at the
    end moves 4(k + 2) bytes per element, after early folds 16 (the sums, the last sender, the
    result), so it saves nothing below 3 and would still hold the sums' memory.
    """

    def __init__(self, targets: list[np.ndarray], expected: list[Hashable], scratch: ReusedArrays | None = None,
                 early: bool = True) -> None:
        self._folds = [MergeFold(t, scratch) for t in targets]
        self._early = early and len(expected) >= EARLY_SENDERS
        self._due = list(reversed(expected))  # the expected keys not folded yet, the first last
        self._waiting: dict[Hashable, list[Contribution | None]] = {}  # offered, not folded yet
        self.refused: dict[Hashable, int] = {}  # per key folded: its values refused as not finite

    def offer(self, key: Hashable, contributions: list[Contribution | None]) -> bool:
        """Take a sender's contributions (one per target), to fold later; False, taking nothing, for
        a key offered before."""
        if key in self._waiting or key in self.refused:
            return False
        self._waiting[key] = contributions
        return True

    @property
    def keys(self) -> list[Hashable]:
        """Every key offered (folded or not)."""
        return [*self.refused, *self._waiting]

    def fold_due(self) -> None:
        """Fold, in order, the keys offered whose expected keys before them are all in (with ``early``)."""
        due = []
        while self._early and self._due and self._due[-1] in self._waiting:
            due.append(self._due.pop())
        if due:
            self._fold(due, finish=False)

    def pending(self) -> list[tuple[Hashable, list[Contribution | None]]]:
        """The offered keys not folded yet and their contributions, in the merge's order, taken out
        (for a merge of its own: `sync.robust`, which needs them all at once)."""
        return [(k, self._waiting.pop(k)) for k in self._order()]

    def finish(self) -> list[float]:
        """Fold what waits and average every target in place; per target, the fraction of (element,
        contribution) pairs that arrived over the whole merge (1.0 for one nothing was added to)."""
        return self._fold(self._order(), finish=True)

    def _order(self) -> list[Hashable]:
        """The keys waiting, in the merge's order."""
        expected = [k for k in reversed(self._due) if k in self._waiting]
        return expected + sorted(set(self._waiting) - set(expected))

    def _fold(self, keys: list[Hashable], finish: bool) -> list[float]:
        offered = [self._waiting.pop(k) for k in keys]
        fractions = []
        for i, fold in enumerate(self._folds):
            pieces = [c[i] for c in offered if c[i] is not None]
            if finish:
                fractions.append(fold.finish(pieces))
            else:
                fold.add(pieces)
        self.refused.update((k, nonfinite(c)) for k, c in zip(keys, offered))
        return fractions


def _target_code(own: np.ndarray) -> int:
    """own's dtype code, as a tensor merged into (ValueError or TypeError when it cannot be one)."""
    if not own.flags.c_contiguous:
        raise ValueError("merge needs a C-contiguous parameter")
    code = _code(own)
    if code in (lib.P2P_I8, lib.P2P_I4):
        raise TypeError(f"cannot merge into a tensor of dtype {own.dtype}")
    return code


def _structs(own: np.ndarray, contributions: list[Contribution]) -> tuple[Any, list[np.ndarray]]:
    """The contributions as C structs for merging into `own`, and the arrays they point into (to
    hold alive until the call returns)."""
    structs = ffi.new("p2p_contribution[]", max(len(contributions), 1))
    keep: list[np.ndarray] = []
    for s, c in zip(structs, contributions):
        _describe(s, own, c, keep)
    return structs, keep


def decode(c: Contribution, n: int, out: np.ndarray | None = None,
           usable: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """c's n values as float32, read as the merge reads them, and per element whether it arrived and
    was not refused (the values are 0 where not), into `out` (float32) and `usable` (bool) when
    given, else new arrays; sets c.nonfinite. ValueError (TypeError for its dtype) for a
    contribution that is `unfit` for n elements."""
    out = np.empty(n, dtype=np.float32) if out is None else out
    usable = np.empty(n, dtype=bool) if usable is None else usable
    if out.dtype != np.float32 or usable.dtype != np.bool_ or out.size != n or usable.size != n:
        raise ValueError(f"decode: outputs of {n} float32 and bool elements, got {out.dtype}[{out.size}] "
                         f"and {usable.dtype}[{usable.size}]")
    _read(c, out, lambda s, refused: lib.p2p_decode(s, n, ffi.from_buffer("float[]", out),
                                                   ffi.from_buffer("uint8_t[]", usable), refused))
    return out, usable


def place(c: Contribution, out: np.ndarray, base: np.ndarray | None = None) -> None:
    """c's values (read as `decode` reads them) put into `out` (float32, flat) where they arrived and
    were not refused, each plus base's element when `base` (float32, out's size; may be out) is
    given; out keeps its own values elsewhere. Sets c.nonfinite; errors as `decode`'s."""
    n = out.size
    if out.dtype != np.float32 or out.ndim != 1 or (base is not None and (base.dtype != np.float32 or base.size != n)):
        raise ValueError(f"place: a flat float32 output and base, got {out.dtype}[{out.shape}] and "
                         f"{None if base is None else f'{base.dtype}[{base.size}]'}")
    _read(c, out, lambda s, refused: lib.p2p_place(s, n, ffi.from_buffer("float[]", out),
                                                  ffi.NULL if base is None else ffi.from_buffer("float[]", base),
                                                  refused))


def _read(c: Contribution, out: np.ndarray, call: Any) -> None:
    """call(struct, refused) with c described as a contribution to `out` (the C reader's `out`);
    sets c.nonfinite to what it refused."""
    s = ffi.new("p2p_contribution *")
    keep: list[np.ndarray] = []
    _describe(s, out, c, keep)
    refused = ffi.new("uint64_t *")
    check(call(s, refused))
    c.nonfinite = int(refused[0])


def _describe(s: Any, own: np.ndarray, c: Contribution, keep: list[np.ndarray]) -> None:
    """Fill the C struct s with c as a contribution to `own` (ValueError or TypeError when it is
    `unfit`); keep gets the arrays s points into, to hold alive until the call returns."""
    code = _code(c.values)  # TypeError for a dtype it cannot merge
    problem = unfit(own, c)
    if problem:
        raise ValueError(problem)
    values = np.ascontiguousarray(c.values)
    keep.append(values)
    s.values, s.values_bytes, s.dtype, s.finite_only = ffi.from_buffer(values), values.nbytes, code, c.finite_only
    if code in (lib.P2P_I8, lib.P2P_I4):
        block = c.block or max(own.size, 1)
        scales = np.ascontiguousarray(c.scales, dtype=np.float32)
        keep.append(scales)
        s.scales, s.nscales, s.block = ffi.from_buffer("float[]", scales), scales.size, block
    if c.mask is not None:
        mask = np.ascontiguousarray(c.mask, dtype=bool)
        keep.append(mask)
        s.element_arrived = ffi.from_buffer(mask)
    if c.chunks is not None:
        arrived = np.ascontiguousarray(c.chunks.arrived, dtype=bool)
        keep.append(arrived)
        s.chunk_arrived, s.nchunks = ffi.from_buffer(arrived), arrived.size
        s.first_byte, s.chunk_size = c.chunks.first_byte, c.chunks.chunk_size
