"""Partitioned rounds: a full average that costs each uplink about what a ring all-reduce does.

The exchanged tensors, read as one sequence of elements, are cut into one contiguous part per live
peer; peer k aggregates part k. Round r has two phases:

    1. scatter: every peer sends part k of its model to peer k (message 2r);
    2. peer k averages the part-k values that arrived with its own, per element (a lost chunk does
       not count, as in every merge), and sends the result to every other peer (message 2r+1);
       each puts it in place where it arrived: a lost piece keeps the peer's own value.

With exact delivery every peer ends the round with the same model, the average of all of them (to
float rounding). Each uplink carries (M - m_i) in the scatter and (n-1) m_i in the gather: with
equal parts 2(n-1)/n of the model M, as a ring all-reduce does, instead of (n-1) M for a full
average by multicast. Parts are sized from the view's bandwidths so that every peer's transfers
take about as long (`part_bytes`): a slow peer aggregates a smaller part, down to none.

With ``--compress`` both phases carry the change since the round before (x - anchor), not values:
after a round every peer holds the same model, its anchor, so a change is all the others need, and
a change is far smaller than the values it moves (int4 rounds it to 1/14 of its block's largest
change instead of 1/14 of the largest weight). The scatter sends each peer's change with its own
error feedback; the aggregator averages the changes, sends their average with error feedback of
its own, and puts the same decoded average on its anchor as every receiver does. A peer whose
anchor is off (a gather piece lost to a loss bound or a deadline, a joiner's model, different
initial models) would stay off for good, since changes never carry the anchor: so every
RESYNC_ROUNDS-th round of a fragment (its first included) exchanges values instead, in both phases,
in the format (int8 for int4), without error feedback: its average is the true one whatever the
anchors, and every peer leaves it with the same model (about 10% more bytes than int4 throughout).

Loss bounds and Early Close apply per part (the smallest bound of the layers in the array a part
covers: a part cuts an array anywhere) and the deadline per phase. The value filter does not apply (each part is averaged whole).
Peers that plan a round from different views cut different parts: such a message does not fit and
counts as not arrived (the round keeps those elements as they are), so a view change costs at
most a partial round. With ``--fragments F`` a round parts and averages its fragment's arrays
only (see `p2plearn.sync.fragments`), each fragment with its own layout. Tuning: this mode pays
where a full average is wanted each round (few peers, a large --period); with many peers, a
sparse plan (--sync bsp --selection selmcast) mixes less per round but its uplinks carry only p
copies.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from p2plearn.protocols import PendingSend
from p2plearn.selection import PACING_HEADROOM
from p2plearn.sync.base import AHEAD_ROUNDS, RoundStats, Synchronizer
from p2plearn.sync.bfloat16 import values
from p2plearn.sync.compress import Compressor, stored
from p2plearn.sync.inbox import UNUSABLE
from p2plearn.sync.merge import Contribution, merge_parameter, unfit
from p2plearn.transport import Delivery

ALIGN = 64  # part boundaries fall on multiples of this many elements: whole chunks, no sliver parts
# compressed rounds: every this many rounds of a fragment exchange values, not changes (see the docstring)
RESYNC_ROUNDS = 8

Slices = list[tuple[int, int, int]]  # (tensor index, first element, end element)


def part_bytes(capacity: np.ndarray, model_bytes: float) -> np.ndarray:
    """Bytes of the model each peer aggregates, from each peer's bandwidth (bytes/s over its slower
    direction; 0 for a peer that takes no part in the round).

    Among n peers, peer k moves M + (n-2) m_k each way (M - m_k of its own model out and n-1
    others' part k in, then its part out to n-1 peers and the rest in), so parts
    m_k = (T c_k - M) / (n - 2), with T = (n - 2 + a) M / sum(c) over the a aggregators, give every
    aggregator the same time T. A peer too slow for even that (m_k < 0) aggregates nothing, and
    the rest are solved again. Two peers: equal parts (their traffic does not depend on the cut).
    """
    capacity = np.asarray(capacity, dtype=float)
    parts = np.zeros(len(capacity))
    aggregators = capacity > 0
    n = int(aggregators.sum())
    if n == 0:
        return parts
    if n <= 2:
        parts[aggregators] = model_bytes / n
        return parts
    while True:
        c = capacity[aggregators]
        t = (n - 2 + len(c)) * model_bytes / c.sum()
        share = (t * c - model_bytes) / (n - 2)
        if (share >= 0).all():
            parts[aggregators] = share
            return parts
        aggregators[np.flatnonzero(aggregators)[share < 0]] = False


def partition(numels: list[int], parts: np.ndarray) -> list[Slices]:
    """Cut tensors of `numels` elements, read in order as one sequence, into consecutive parts in
    proportion to `parts` (boundaries on multiples of ALIGN); per part, its pieces of tensors."""
    total = sum(numels)
    weights = np.asarray(parts, dtype=float)
    cuts = np.concatenate(([0.0], np.cumsum(weights))) / max(weights.sum(), 1e-300) * total
    bounds = np.minimum(np.round(cuts / ALIGN).astype(np.int64) * ALIGN, total)
    # the last part with a weight ends the sequence: rounding the sums must not leave a sliver to
    # peers after it that take no part (their pace is 0: a flow that never ends)
    last = np.flatnonzero(weights > 0)
    bounds[last[-1] + 1 if len(last) else len(bounds) - 1:] = total
    starts = np.concatenate(([0], np.cumsum(numels)))
    out: list[Slices] = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        pieces = []
        for t, (t0, t1) in enumerate(zip(starts[:-1], starts[1:])):
            a, b = max(lo, t0), min(hi, t1)
            if a < b:
                pieces.append((t, int(a - t0), int(b - t0)))
        out.append(pieces)
    return out


class Partitioned(Synchronizer):
    """BSP rounds in which every live peer averages with every other, through parts (see the
    module's docstring). Takes Synchronizer's arguments; ``selection`` and ``fanout`` are unused
    (every live peer is in every round) and ``value_filter`` must be None."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("value_filter") is not None:
            raise ValueError("the value filter does not apply to partitioned rounds (each part is averaged whole)")
        super().__init__(*args, **kwargs)
        self._flat = [p.reshape(-1) for p in self.params]  # views of the (contiguous) parameters
        # compressed rounds: the averaged change of this peer's parts, with error feedback of its own,
        # and the values a resync round gathers (int4's resyncs at 8 bits)
        mode = self.compressor.mode if self.compressor is not None else None
        keep = self.compressor.keep_nonfinite if mode else False
        self._gather_format = Compressor(mode, [p.size for p in self.params], keep) if mode else None
        self._resync_format = Compressor("int8" if mode == "int4" else mode, None, keep) if mode else None
        # per fragment, the last view's layout, by the view's order
        self._layouts: dict[int, tuple[tuple, PartLayout]] = {}

    def _wanted_rounds(self) -> tuple[int, int]:
        """Message ids: round r scatters as 2r and gathers as 2r + 1."""
        return 2 * (self.clock - 1), 2 * (self.clock + AHEAD_ROUNDS) + 1

    def _wait_round(self, rnd: int, senders: set[int], until: float) -> None:
        """Wait for round `rnd`'s scatter messages (this peer's part) from `senders`."""
        # a sender's gather (2r + 1) overlaps its scatter and may come first: its next round says it moved on
        self.inbox.wait_round(2 * rnd, senders, until, self._alive, moved_on=2 * rnd + 2)

    def _inputs(self, rnd: int) -> list[Delivery]:
        """Round `rnd`'s scatter messages that came (this peer's part, from each sender)."""
        self.inbox.drain()
        return self.inbox.take(2 * rnd, 2 * rnd)

    def step(self, loss: float | None = None) -> RoundStats:
        rnd = self.clock
        carried = self.fragments.arrays(rnd)
        t0 = time.monotonic()
        self._computed_until(t0)
        self._track_updates(loss)
        me = self.client.rank
        resync = self._resync(rnd)
        self.network.expected_bytes = self._model_bytes(carried, resync)
        layout = self._plan(self.client.view_for(rnd), rnd)
        # the layout is planned at the format's bytes; a resync round carries values (int4's in int8)
        self.network.planned_time_s = \
            layout.planned_time * self.network.expected_bytes / self._model_bytes(carried) if layout else 0.0
        bounds, deadline = self.tolerance.bounds(rnd, self.layers, self.network, self.training)
        bounds = self.array_bounds(bounds)  # parts cut arrays anywhere: each keeps its array's smallest bound
        if layout is None or me not in layout.ranks:  # alone, or not in the view that plans this round yet
            self.clock = rnd + 1
            self._report(rnd, [], [], time.monotonic() - t0, loss, deadline)
            return RoundStats(rnd, [], [], 0, 1.0, 0.0, 0.0, time.monotonic() - t0, 0.0, 0, 0)
        engines = self.client.members
        others = [k for k in layout.ranks if k != me and k in engines and engines[k].engine]
        mine = layout.slices[me]

        def pieces(slices: Slices) -> list[np.ndarray]:
            return [self._flat[t][a:b] for t, a, b in slices]

        def changes(slices: Slices) -> list[np.ndarray]:
            """The pieces' change since the last round (float32): what compressed rounds exchange."""
            return [values(self._flat[t][a:b]).astype(np.float32) - values(self._previous[t][a:b])
                    for t, a, b in slices]

        sent_bytes = 0

        def send(msg_id: int, arrays: list[np.ndarray], slices: Slices,
                 receivers: list[tuple[str, int, float]], fmt: Compressor | None) -> PendingSend:
            nonlocal sent_bytes
            loss_bounds = [bounds[t] for t, _, _ in slices]
            if fmt is not None:
                loss_bounds = fmt.loss_bounds(loss_bounds)
            sent_bytes += sum(a.nbytes for a in arrays) * len(receivers)
            return self.channel.send(msg_id, arrays, receivers, loss_bounds=loss_bounds, deadline=deadline,
                                     slow_close=self.slow_close)

        # 1. scatter: part k (compressed: its change, or its values on a resync round) to its aggregator k
        compressed = self.compressor is not None
        scatter_format = (self._resync_format if resync else self.compressor) if compressed else None
        gather_format = (self._resync_format if resync else self._gather_format) if compressed else None
        scatter = []
        for k in others:
            if theirs := layout.slices[k]:
                if not compressed:
                    arrays = pieces(theirs)
                elif resync:  # the values carry what the error feedback held
                    arrays = scatter_format.encode(pieces(theirs), theirs)
                    self.compressor.forget(theirs)
                else:
                    arrays = self.compressor.encode(changes(theirs), theirs)
                receiver = [(*engines[k].engine, layout.scatter_rate[me][k])]
                scatter.append((k, send(2 * rnd, arrays, theirs, receiver, scatter_format)))
        self._interrupted = False
        merged_from: set[int] = set()
        fractions: list[float] = []
        if mine:
            self._wait_round(rnd, set(others), t0 + self._wait_limit(deadline))
            merge_t0 = time.monotonic()
            usable = [(d.sender, c) for d in self._inputs(rnd)
                      if (c := self._fits(d, mine, scatter_format)) is not None]
            averaged = changes(mine) if compressed and not resync else pieces(mine)
            for i, own in enumerate(averaged):
                fractions.append(merge_parameter(own, [c[i] for _, c in usable]))
            if usable:  # per message received, as the load model counts it (here: parts of models)
                self._merge_s = (time.monotonic() - merge_t0) / len(usable)
            merged_from.update(sender for sender, _ in usable)
            for sender, c in usable:
                self._count_nonfinite(sender, c)
            if compressed:  # this peer's parts become what every receiver reads of them
                averaged = self._encode_gather(averaged, mine, gather_format, resync)
        # 2. gather: the averaged part to everyone else; theirs into place where it arrived
        gather = send(2 * rnd + 1, averaged, mine, [(*engines[j].engine, layout.gather_rate[me][j]) for j in others],
                      gather_format) if mine and others else None
        aggregators = {k for k in others if layout.slices[k]}
        self.inbox.wait_round(2 * rnd + 1, aggregators, time.monotonic() + self._wait_limit(deadline), self._alive)
        sent = [handle.wait()[0] for _, handle in scatter]  # they read the parts about to be overwritten
        self.inbox.drain()
        for d in self.inbox.take(2 * rnd + 1, 2 * rnd + 1):
            theirs = layout.slices.get(d.sender, [])
            arrived = self._fits(d, theirs, gather_format) if d.sender in aggregators else None
            if arrived is None:
                continue
            for i, ((t, a, b), c) in enumerate(zip(theirs, arrived)):
                if gather_format is None:  # plain values, where they arrived
                    got, where = c.values, d.element_mask(i) if c.chunks is not None else True
                else:  # where they arrived and were not refused as not finite
                    got, where = self._gathered(c, t, a, b, gather_format, resync)
                np.copyto(self._flat[t][a:b], got, where=where)
            self._count_nonfinite(d.sender, arrived)
            merged_from.add(d.sender)
        gathered = gather.wait() if gather is not None else []
        comm_s = time.monotonic() - t0
        self._outer_step(carried)
        self.clock = rnd + 1
        flows = [(k, layout.scatter_rate[me][k]) for k, _ in scatter] + \
                ([(j, layout.gather_rate[me][j]) for j in others] if gather is not None else [])
        stats = sent + list(gathered)
        self._backlog = self.inbox.pending()
        self._report(rnd, flows, stats, comm_s, loss, deadline)
        self._round_end = time.monotonic()
        results = dict(Counter(st.result for st in stats))
        return RoundStats(rnd, [k for k, _ in flows], sorted(aggregators), len(merged_from),
                          float(np.mean(fractions)) if fractions else 1.0, float(len(layout.ranks) - 1),
                          layout.planned_time, comm_s, max((st.elapsed_s for st in stats), default=0.0), sent_bytes,
                          sum(st.retransmitted for st in stats), results, sorted(merged_from))

    def state_dict(self) -> dict[str, Any]:
        """Synchronizer's state and, compressed, the gather's error feedback."""
        state = super().state_dict()
        if self._gather_format is not None:
            state["gather_compressor"] = self._gather_format.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self._gather_format is not None and state.get("gather_compressor") is not None:
            self._gather_format.load_state_dict(state["gather_compressor"])

    def _resync(self, rnd: int) -> bool:
        """Whether round `rnd` exchanges values, not changes, in both phases (see the docstring)."""
        return self.compressor is not None and (rnd // self.fragments.count) % RESYNC_ROUNDS == 0

    def _encode_gather(self, averaged: list[np.ndarray], mine: Slices, fmt: Compressor, resync: bool) -> list[np.ndarray]:
        """The arrays that carry this peer's averaged parts (changes; values on a resync round);
        the parts themselves become what the receivers read of them (plus the anchor, for changes)."""
        if resync:
            self._gather_format.forget(mine)
        decoded: list[np.ndarray] = []
        arrays = fmt.encode(averaged, mine, decoded)
        for (t, a, b), read in zip(mine, decoded):
            own = self._flat[t][a:b]
            own[...] = stored(read if resync else values(self._previous[t][a:b]) + read, own)
        return arrays

    def _gathered(self, c: Contribution, t: int, a: int, b: int, fmt: Compressor,
                  resync: bool) -> tuple[np.ndarray, np.ndarray]:
        """Elements a:b of array t as an aggregator's compressed gather sets them: this peer's anchor
        plus the averaged change (the values on a resync round), and where (`Compressor.decode`)."""
        own = self._flat[t][a:b]
        if resync:
            return fmt.decode(c, own)
        change, usable = fmt.decode(c, np.empty(own.size, np.float32))
        return stored(values(self._previous[t][a:b]) + change, own), usable

    def _plan(self, view: Any, rnd: int) -> PartLayout | None:
        """Round `rnd`'s parts (of its fragment's arrays) and pacing, from the view (the same on
        every peer that holds it)."""
        if view is None:
            return None
        fragment = self.fragments.of_round(rnd)
        cached = self._layouts.get(fragment)
        if cached is None or cached[0] != view.order:
            carried = self.fragments.groups[fragment]
            layout = PartLayout.from_view(view, [self.params[t].size for t in carried], self._model_bytes(carried))
            if len(carried) != len(self.params):  # the parts index the fragment's arrays: make them the model's
                layout = replace(layout, slices={k: [(carried[t], a, b) for t, a, b in s]
                                                 for k, s in layout.slices.items()})
            if cached is not None and self._gather_format is not None and cached[1].slices != layout.slices:
                # what this peer aggregated may now be another's: its error feedback starts afresh
                self._gather_format.forget([(t, 0, self.params[t].size) for t in carried])
            cached = self._layouts[fragment] = (view.order, layout)
        layout = cached[1]
        return layout if len(layout.ranks) >= 2 else None

    def _model_bytes(self, carried: list[int], resync: bool = False) -> int:
        """The bytes of the arrays `carried` (a round's fragment: all of them without fragments) on the
        wire, in the compressed format of a change round or (``resync``) of a resync round."""
        fmt = self._resync_format if resync else self.compressor
        if fmt is not None:
            return fmt.wire_bytes([self.params[t].size for t in carried])
        return sum(self.params[t].nbytes for t in carried)

    def _fits(self, d: Delivery, slices: Slices, fmt: Compressor | None) -> list[Contribution] | None:
        """d's arrays (in `fmt`; None: plain values) as contributions to the pieces `slices` cut, or
        None when they do not fit (another view's parts, a malformed message, or a layout that never
        arrived: counted in the inbox's drops)."""
        pieces = [self._flat[t][a:b] for t, a, b in slices]
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
            self.inbox.drops["unmergeable part"] += 1
            return None
        return out


@dataclass(frozen=True)
class PartLayout:
    """Who aggregates which elements, and how fast each flow is paced (bytes/s), for one view."""

    ranks: list[int]
    slices: dict[int, Slices]
    scatter_rate: dict[int, dict[int, float]]  # sender -> aggregator -> rate
    gather_rate: dict[int, dict[int, float]]   # aggregator -> receiver -> rate
    planned_time: float

    @classmethod
    def from_view(cls, view: Any, numels: list[int], model_bytes: float) -> PartLayout:
        ranks = [int(r) for r in np.flatnonzero(np.asarray(view.alive, dtype=bool))]
        up = np.asarray(view.uplink, dtype=float)[ranks]
        down = np.asarray(view.downlink, dtype=float)[ranks]
        capacity = np.minimum(up, down)
        m = part_bytes(capacity, model_bytes)
        cut = partition(numels, m)
        n = len(ranks)
        slices = {k: cut[i] for i, k in enumerate(ranks)}
        # each sender's flows end together: its uplink shared in proportion to their sizes, capped
        # by the receiver's downlink shared among the n - 1 flows it takes in that phase
        scatter = {k: {j: 0.0 for j in ranks} for k in ranks}
        gather = {k: {j: 0.0 for j in ranks} for k in ranks}
        for a, i in enumerate(ranks):
            for b, j in enumerate(ranks):
                if i == j:
                    continue
                out_i = max(model_bytes - m[a], 1.0)
                scatter[i][j] = PACING_HEADROOM * min(up[a] * m[b] / out_i, down[b] / (n - 1))
                gather[i][j] = PACING_HEADROOM * min(up[a] / (n - 1), down[b] * m[a] / max(model_bytes - m[b], 1.0))
        planned = float(np.max((model_bytes + (n - 2) * m) / np.maximum(capacity, 1e-9))) if n >= 2 else 0.0
        return cls(ranks, slices, scatter, gather, planned)
