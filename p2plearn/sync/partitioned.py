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
from dataclasses import replace
from collections.abc import Iterable
from typing import Any

import numpy as np

from p2plearn.protocols import PendingSend
from p2plearn.sync.base import AHEAD_ROUNDS, RoundStats, Synchronizer
from p2plearn.sync.compress import Compressor
from p2plearn.sync.exchange import PartExchange, PartReduce
from p2plearn.sync.layout import ALIGN, PartLayout, Slices, part_bytes, partition
from p2plearn.sync.merge import Contribution, nonfinite
from p2plearn.transport import Delivery

__all__ = ["ALIGN", "FILTER_REFUSED", "PartLayout", "Partitioned", "RESYNC_ROUNDS", "part_bytes", "partition"]

# compressed rounds: every this many rounds of a fragment exchange values, not changes (see the docstring)
RESYNC_ROUNDS = 8
FILTER_REFUSED = "the value filter does not apply to partitioned rounds (each part is averaged whole)"


class Partitioned(Synchronizer):
    """BSP rounds in which every live peer averages with every other, through parts (see the
    module's docstring). Takes Synchronizer's arguments; ``selection`` and ``fanout`` are unused
    (every live peer is in every round) and ``value_filter`` must be None. The round's arithmetic is
    `PartExchange`'s; this class moves its messages over the channel and the inbox."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("value_filter") is not None:
            raise ValueError(FILTER_REFUSED)
        super().__init__(*args, **kwargs)
        self.exchange = PartExchange([p.reshape(-1) for p in self.params], self.compressor, self._previous)
        # per fragment, the last view's layout, by the view's order
        self._layouts: dict[int, tuple[tuple, PartLayout]] = {}

    def _wanted_rounds(self) -> tuple[int, int]:
        """Message ids: round r scatters as 2r and gathers as 2r + 1."""
        return 2 * (self.clock - 1), 2 * (self.clock + AHEAD_ROUNDS) + 1

    def step(self, loss: float | None = None) -> RoundStats:
        rnd = self.clock
        carried = self.fragments.arrays(rnd)
        t0 = time.monotonic()
        self._computed_until(t0)
        self._track_updates(loss)
        me = self.client.rank
        resync = self._resync(rnd)
        exchange = self.exchange
        exchange.anchor = self._previous  # a loaded state replaces the list
        self.network.expected_bytes = exchange.wire_bytes(carried, resync)
        layout = self._plan(self.client.view_for(rnd), rnd)
        # the layout is planned at the format's bytes; a resync round carries values (int4's in int8)
        self.network.planned_time_s = \
            layout.planned_time * self.network.expected_bytes / exchange.wire_bytes(carried) if layout else 0.0
        bounds, deadline = self.tolerance.bounds(rnd, self.layers, self.network, self.training)
        bounds = self.array_bounds(bounds)  # parts cut arrays anywhere: each keeps its array's smallest bound
        if layout is None or me not in layout.ranks:  # alone, or not in the view that plans this round yet
            self.clock = rnd + 1
            self._report(rnd, [], [], time.monotonic() - t0, loss, deadline)
            return RoundStats(round=rnd, receivers=[], senders=[], merged=0, delivered=1.0, fanout=0.0, planned_s=0.0,
                              comm_s=time.monotonic() - t0, send_s=0.0, bytes_sent=0, retransmitted=0)
        engines = self.client.members
        others = [k for k in layout.ranks if k != me and k in engines and engines[k].engine]
        mine = layout.slices[me]
        scatter_format, gather_format = exchange.formats(resync)
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
        scatter = []
        for k in others:
            if theirs := layout.slices[k]:
                receiver = [(*engines[k].engine, layout.scatter_rate[me][k])]
                scatter.append((k, send(2 * rnd, exchange.scatter(theirs, resync), theirs, receiver, scatter_format)))
        self._interrupted = False
        merged_from: set[int] = set()
        fractions: list[float] = []
        if mine:
            # merged while the wait is idle; a sender's gather (2r + 1) overlaps its scatter and may
            # come first: its next round says it moved on
            reduction = exchange.begin(mine, others, resync)
            self._offer(reduction, self.inbox.arrivals(2 * rnd, set(others), t0 + self._wait_limit(deadline),
                                                       self._alive, moved_on=2 * rnd + 2), mine, scatter_format)
            merge_t0 = time.monotonic()
            averaged, fractions = reduction.finish()
            if reduction.refused:  # per message received, as the load model counts it (here: parts of models)
                self._merge_s = (time.monotonic() - merge_t0) / len(reduction.refused)
            merged_from.update(reduction.refused)
            for sender, refused in reduction.refused.items():
                self._count_nonfinite(sender, refused)
            del reduction  # the last senders' engine buffers go back to the pool now, for the gather phase's
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
            exchange.place(theirs, arrived, gather_format, resync)
            self._count_nonfinite(d.sender, nonfinite(arrived))
            merged_from.add(d.sender)
        gathered = gather.wait() if gather is not None else []
        exchange.settle()
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
        return RoundStats(round=rnd, receivers=[k for k, _ in flows], senders=sorted(aggregators),
                          merged=len(merged_from), delivered=float(np.mean(fractions)) if fractions else 1.0,
                          fanout=float(len(layout.ranks) - 1), planned_s=layout.planned_time, comm_s=comm_s,
                          send_s=max((st.elapsed_s for st in stats), default=0.0), bytes_sent=sent_bytes,
                          retransmitted=sum(st.retransmitted for st in stats), results=results,
                          merged_from=sorted(merged_from))

    def state_dict(self) -> dict[str, Any]:
        """Synchronizer's state and, compressed, the gather's error feedback."""
        state = super().state_dict()
        if self.exchange.gather_format is not None:
            state["gather_compressor"] = self.exchange.gather_feedback.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.exchange.gather_format is not None and state.get("gather_compressor") is not None:
            self.exchange.gather_feedback.load_state_dict(state["gather_compressor"], [p.size for p in self.params])

    def _resync(self, rnd: int) -> bool:
        """Whether round `rnd` exchanges values, not changes, in both phases (see the docstring)."""
        return self.compressor is not None and (rnd // self.fragments.count) % RESYNC_ROUNDS == 0

    def _plan(self, view: Any, rnd: int) -> PartLayout | None:
        """Round `rnd`'s parts (of its fragment's arrays) and pacing, from the view (the same on
        every peer that holds it)."""
        if view is None:
            return None
        fragment = self.fragments.of_round(rnd)
        cached = self._layouts.get(fragment)
        if cached is None or cached[0] != view.order:
            carried = self.fragments.groups[fragment]
            layout = PartLayout.from_view(view, [self.params[t].size for t in carried],
                                          self.exchange.wire_bytes(carried))
            if len(carried) != len(self.params):  # the parts index the fragment's arrays: make them the model's
                layout = replace(layout, slices={k: [(carried[t], a, b) for t, a, b in s]
                                                 for k, s in layout.slices.items()})
            cached = self._layouts[fragment] = (view.order, layout)
        layout = cached[1]
        return layout if len(layout.ranks) >= 2 else None

    def _offer(self, reduction: PartReduce, arrivals: Iterable[Delivery | None], mine: Slices,
               fmt: Compressor | None) -> None:
        """Offer each scatter message to this peer's part's merge as it arrives, and fold what is
        due while the wait is idle (a folded sender's engine buffer goes back to the pool then)."""
        for d in arrivals:
            if d is None:
                reduction.fold_due()
                continue
            c = self._fits(d, mine, fmt)
            if c is not None and not reduction.offer(d.sender, c):
                self.inbox.drop("a second message for one round", d.sender)

    def _fits(self, d: Delivery, slices: Slices, fmt: Compressor | None) -> list[Contribution] | None:
        """d's contributions to the pieces `slices` cut (`PartExchange.contributions`), or None, counted
        in the inbox's drops, when they do not fit (another view's parts, a malformed message, or a
        layout that never arrived)."""
        out = self.exchange.contributions(d, slices, fmt)
        if out is None:
            self.inbox.drops["unmergeable part"] += 1
        return out
