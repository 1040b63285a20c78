"""One peer's side of a partitioned all-reduce, apart from whatever moves the messages.

A round (see `p2plearn.sync.partitioned` for the whole story) is, for each peer, four steps that
this class computes and its driver orders around its transport:

    1. `scatter(theirs)`: what to send the aggregator of each other part;
    2. `contributions(d, mine)`: what one of those messages brings to this peer's part (None when
       it does not fit: another view's parts, another format, a malformed message);
    3. `reduce(mine, inputs)`: this peer's part averaged (or reduced) with what came, in place; the
       arrays that carry it to everyone else;
    4. `contributions(d, theirs)` + `place(theirs, ...)`: another aggregator's result put in place
       where it arrived (a lost piece keeps this peer's value).

and `settle()` ends the round (what its arrays kept across rounds did not use goes).

Training's `Partitioned` drives it over the engine and the inbox, the DDP backend's
`Collectives.allreduce` over the engine and its mailbox, and the simulator's `VirtualPartitioned`
over virtual deliveries on its flow-level network: one arithmetic, one codec, one merge for all three.

With a compressor, rounds exchange the change since ``anchor`` (the values every peer held after the
last round) in the compressed format, with error feedback: the scatter's this peer's own, the
gather's this peer's as an aggregator (for its part only: `PartFeedback`). The encoder subtracts the
anchor and the receiver adds it back in their own passes (float32 models): no array of the model's
size between them. A resync round exchanges values instead, int4's at 8 bits, without error
feedback, which re-aligns anchors that drifted (`Partitioned` decides which rounds).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from p2plearn.sync.bfloat16 import BF16Array, bf16_values, store, values
from p2plearn.sync.compress import Compressor, stored
from p2plearn.sync.feedback import PartFeedback
from p2plearn.sync.inbox import UNUSABLE
from p2plearn.sync.layout import Slices
from p2plearn.sync.merge import Contribution, OrderedFolds, decode, place, unfit
from p2plearn.sync.reused import ReusedArrays
from p2plearn.transport.delivery import Delivery

# exact reductions (the DDP backend's ops other than a mean of floats), in rank order
REDUCE = {"sum": np.add, "avg": np.add, "product": np.multiply, "min": np.minimum, "max": np.maximum,
          "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}  # bitwise: integers and bools


class PartExchange:
    """The partitioned all-reduce of the arrays ``flat`` (1-d views, owned by the caller, averaged
    in place), for one peer.

    ``compressor``: the scatter's format with this peer's error feedback (None: plain values in the
    arrays' own dtype); ``anchor``: per array, what every peer held after the last round (compressed
    rounds only; the caller keeps it current: it may assign another list between rounds).
    """

    def __init__(self, flat: list[np.ndarray], compressor: Compressor | None = None,
                 anchor: list[np.ndarray] | None = None) -> None:
        if compressor is not None and anchor is None:
            raise ValueError("compressed partitioned rounds exchange changes: they need the anchor")
        self.flat = flat
        self.compressor = compressor
        self.anchor = anchor
        mode = compressor.mode if compressor is not None else None
        keep = compressor.keep_nonfinite if mode else False
        # this peer's averaged parts, with error feedback of their own (its part's), and the values of a resync round
        self.gather_format = Compressor(mode, None, keep) if mode else None
        self.gather_feedback = PartFeedback()
        self.resync_format = Compressor("int8" if mode == "int4" else mode, None, keep) if mode else None
        self._scratch = ReusedArrays()  # compressed rounds' changes and decoded parts, kept across rounds

    # -- formats and sizes ------------------------------------------------------------------
    def formats(self, resync: bool = False) -> tuple[Compressor | None, Compressor | None]:
        """The scatter's and the gather's formats (None: plain values) in a change or resync round."""
        if self.compressor is None:
            return None, None
        return (self.resync_format, self.resync_format) if resync else (self.compressor, self.gather_format)

    def wire_bytes(self, arrays: list[int], resync: bool = False) -> int:
        """The bytes that carry the arrays of indices ``arrays`` whole, in a round's scatter format."""
        fmt = self.formats(resync)[0]
        if fmt is not None:
            return fmt.wire_bytes([self.flat[t].size for t in arrays])
        return sum(self.flat[t].nbytes for t in arrays)

    # -- the four steps -----------------------------------------------------------------------
    def pieces(self, slices: Slices) -> list[np.ndarray]:
        """Views of the elements ``slices`` cut."""
        return [self.flat[t][a:b] for t, a, b in slices]

    def scatter(self, slices: Slices, resync: bool = False) -> list[np.ndarray]:
        """The arrays that carry this peer's elements ``slices`` to their aggregator (plain: views,
        read until the send is done)."""
        if self.compressor is None:
            return self.pieces(slices)
        if resync:  # the values carry what the error feedback held
            arrays = self.resync_format.encode(self.pieces(slices), slices)
            self.compressor.forget(slices)
            return arrays
        if all(self._plain_change(t) for t, _, _ in slices):  # the change made in the encoder's pass
            return self.compressor.encode(self.pieces(slices), slices,
                                          anchors=[self.anchor[t][a:b] for t, a, b in slices])
        return self.compressor.encode(self._changes(slices), slices)

    def contributions(self, d: Delivery, slices: Slices, fmt: Compressor | None) -> list[Contribution] | None:
        """d's arrays (in ``fmt``; None: plain values) as contributions to the pieces ``slices`` cut,
        or None when they do not fit (the caller counts it)."""
        pieces = self.pieces(slices)
        try:
            if fmt is not None:
                out = fmt.contributions(d, [p.size for p in pieces])
            elif d.arrays is None or len(d.arrays) != len(pieces) or any(
                    a.shape != p.shape or a.dtype != p.dtype for a, p in zip(d.arrays, pieces)):
                out = None
            else:
                out = [Contribution(a, chunks=d.chunks(i)) for i, a in enumerate(d.arrays)]
        except UNUSABLE:
            out = None
        if out is None or any(unfit(p, c) for p, c in zip(pieces, out)):
            return None
        return out

    def begin(self, slices: Slices, expected: list[int], resync: bool = False) -> PartReduce:
        """The mean of this peer's part (``slices``) with the senders' contributions, merged as they
        arrive (`PartReduce`; ``expected``: the senders waited for)."""
        compressed = self.compressor is not None
        averaged = self._changes(slices) if compressed and not resync else self.pieces(slices)
        return PartReduce(self, slices, averaged, expected, resync)

    def reduce(self, slices: Slices, inputs: Mapping[int, list[Contribution]], resync: bool = False,
               op: str = "mean", rank: int = 0) -> tuple[list[np.ndarray], list[float]]:
        """This peer's part (``slices``) reduced with ``inputs`` (sender -> its contributions to each
        piece), in place: the arrays that carry the result to the other peers, and per piece the
        fraction of (element, sender) pairs that arrived.

        ``op`` "mean" is `begin`'s merge with every input at once (senders in rank order: the sums
        do not depend on arrival order); a `REDUCE` op is exact over this peer (``rank``) and every
        sender, in rank order, and needs every input whole (the DDP backend's other ops and
        integer dtypes)."""
        if op != "mean":
            for i, own in enumerate(self.pieces(slices)):
                ranked = [own.copy() if r == rank else inputs[r][i].values for r in sorted({*inputs, rank})]
                reduce_exact(own, ranked, op)
            return self.pieces(slices), [1.0] * len(slices)
        reduction = self.begin(slices, sorted(inputs), resync)
        for sender, contributions in inputs.items():
            reduction.offer(sender, contributions)
        return reduction.finish()

    def place(self, slices: Slices, arrived: list[Contribution], fmt: Compressor | None,
              resync: bool = False, lost_times: float = 1.0) -> None:
        """Another aggregator's result for the pieces ``slices`` (its `contributions`, in ``fmt``)
        put in place where it arrived (and, compressed, was not refused as not finite).
        ``lost_times`` (plain values only): what the elements that did not arrive are multiplied by
        (the DDP backend's SUM: a rank's own value then stands for the mean, the sum is n times it)."""
        for (t, a, b), c in zip(slices, arrived):
            own = self.flat[t][a:b]
            if fmt is None:
                if c.chunks is None or c.chunks.whole(own.size, c.values.itemsize):
                    np.copyto(own, c.values)  # (no mask the size of the part where nothing was lost)
                else:
                    got = c.chunks.elements(own.size, c.values.itemsize)
                    np.copyto(own, c.values, where=got)
                    if lost_times != 1.0:
                        np.multiply(own, lost_times, out=own, where=~got)
            elif _plain_float32(own) and (resync or _plain_float32(self.anchor[t])):
                place(c, own, None if resync else self.anchor[t][a:b])  # decoded (+ anchor) in one pass
            else:  # a resync round's values, or the change since the anchor
                got, usable = decode(c, own.size, self._scratch.take(own.size, np.float32),
                                     self._scratch.take(own.size, np.bool_))
                if not resync:
                    anchor = self.anchor[t][a:b]
                    got = np.add(anchor, got, out=got) if _plain_float32(anchor) else values(anchor) + got
                np.copyto(own, got if _plain_float32(own) else stored(got, own), where=usable)

    def settle(self) -> None:
        """The end of a round (its driver calls it once a round): the kept arrays (scratch, the formats'
        encoded arrays) that the round did not use and no one holds go."""
        self._scratch.settle()
        for fmt in (self.compressor, self.gather_format, self.resync_format):
            if fmt is not None:
                fmt.settle()

    # -- compressed rounds --------------------------------------------------------------------
    def _plain_change(self, t: int) -> bool:
        """Whether the change of array t is float32 minus float32 (the encoder subtracts such an
        anchor itself)."""
        return _plain_float32(self.flat[t]) and _plain_float32(self.anchor[t])

    def _changes(self, slices: Slices) -> list[np.ndarray]:
        """The pieces' change since the anchor (float32, or wider where the model is): what compressed
        change rounds exchange. Float32 ones are this exchange's scratch, read before the next round."""
        changes = []
        for t, a, b in slices:
            own, anchor = values(self.flat[t][a:b]), values(self.anchor[t][a:b])
            if own.dtype == anchor.dtype == np.float32:
                changes.append(np.subtract(own, anchor, out=self._scratch.take(b - a, np.float32)))
            else:
                changes.append(own.astype(np.float32) - anchor)
        return changes

    def _encode_gather(self, averaged: list[np.ndarray], slices: Slices, resync: bool) -> list[np.ndarray]:
        """The arrays that carry this peer's averaged pieces (changes; values on a resync round);
        the pieces become what the receivers read of them (plus the anchor, for changes)."""
        fmt = self.formats(resync)[1]
        if resync:
            self.gather_feedback.forget(slices)
        decoded: list[np.ndarray] = []
        arrays = fmt.encode(averaged, slices, decoded, None if resync else self.gather_feedback.residuals(slices))
        for (t, a, b), read in zip(slices, decoded):
            own, anchor = self.flat[t][a:b], self.anchor[t][a:b]
            if not resync and _plain_float32(own) and _plain_float32(anchor):
                np.add(anchor, read, out=own)
            else:
                own[...] = stored(read if resync else values(anchor) + read, own)
        return arrays


class PartReduce:
    """This peer's part averaged with its senders' contributions as they arrive (`PartExchange.begin`):
    `offer` each sender's when it comes, `fold_due` while the round waits idle for the others,
    `finish` when the wait is over.

    The senders are folded in rank order, the expected ones first (`OrderedFolds`, whose doc says
    when a fold before the end pays: compressed rounds fold at the end only). So the bits of the mean
    are the same whatever the arrival order and whenever `fold_due` is called, and the same as one
    merge at the end; the end of the round then folds only the senders that came after the last
    `fold_due` or waited on a lower rank.
    """

    def __init__(self, exchange: PartExchange, slices: Slices, averaged: list[np.ndarray], expected: list[int],
                 resync: bool) -> None:
        self._exchange, self._slices, self._resync = exchange, slices, resync
        self._averaged = averaged
        # plain values fold early; compressed rounds at the end
        self._folds = OrderedFolds(averaged, sorted(expected), exchange._scratch,
                                   early=exchange.formats(resync)[0] is None)

    @property
    def refused(self) -> dict[int, int]:
        """Per sender folded: its values refused as not finite."""
        return self._folds.refused

    def offer(self, sender: int, contributions: list[Contribution]) -> bool:
        """Take a sender's contributions (one per piece), to fold later; False, taking nothing, for
        a sender offered before."""
        return self._folds.offer(sender, contributions)

    def fold_due(self) -> None:
        """Fold, in rank order, the senders offered whose lower-ranked expected senders are all in
        (plain values only)."""
        self._folds.fold_due()

    def finish(self) -> tuple[list[np.ndarray], list[float]]:
        """Fold what waits and average: the arrays that carry this peer's part to the other peers,
        and per piece the fraction of (element, sender) pairs that arrived (as `PartExchange.reduce`)."""
        fractions = self._folds.finish()
        averaged = self._averaged
        exchange = self._exchange
        if exchange.compressor is not None:  # this peer's part becomes what every receiver reads of it
            averaged = exchange._encode_gather(averaged, self._slices, self._resync)
        return averaged, fractions


def _plain_float32(a: np.ndarray) -> bool:
    """Whether a holds float32 numbers as they are (not bfloat16 bits)."""
    return a.dtype == np.float32 and not isinstance(a, BF16Array)


def reduce_exact(out: np.ndarray, ranked: list[np.ndarray], op: str) -> None:
    """``out`` = op over ``ranked`` (every rank's values, in rank order, so every rank computes the
    same). Into a BF16Array the inputs are bfloat16 bits, reduced in float32 and rounded once."""
    bits = isinstance(out, BF16Array)
    ufunc = REDUCE[op]
    result = bf16_values(ranked[0]) if bits else ranked[0].copy()  # (a new array either way)
    for v in ranked[1:]:
        ufunc(result, bf16_values(v) if bits else v, out=result)
    if op == "avg":
        result = result / len(ranked) if result.dtype.kind == "f" else result // len(ranked)
    if bits:
        store(out, result)
    else:
        np.copyto(out, result, casting="unsafe")
