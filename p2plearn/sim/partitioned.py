"""Partitioned rounds in virtual time (`--sync partitioned`): training's round on the simulated network.

Every peer has training's `PartExchange` over its replica's row (the same scatter encoding, merge,
gather encoding and placement, the same `Compressor`s with their error feedback, the same resync
rounds), and the messages move as flows; round r, from the view that plans it (training's
`PartLayout`: parts sized so that every peer's transfers take about as long, and each flow's pace):
1. scatter: every peer sends part k of its model (compressed: of its change since the last round)
   to peer k, starting when its compute ends;
2. peer k reduces the part-k messages that arrived with its own (their chunk masks, in C) once every
   scatter message to it arrived or was cut, then sends the result to every other peer;
   each puts it in place where its chunks arrived (a lost piece keeps the peer's own value).
What arrived of a message is a `virtual_delivery`: the delivered fraction of its chunks, the
missing ones drawn among value-only chunks (int8/int4 scales are repaired first, as the engine does).
A peer's round ends when its sends are done and the parts sent to it arrived; then the outer
step. The model is one sequence of elements (the replica's row), cut as training cuts the
exchanged tensors read in order. Loss bounds: each sender's smallest (per-layer bounds are refused
with this mode); the deadline and the slow close apply to each phase.
"""
from __future__ import annotations

import numpy as np

from p2plearn.selection import NetworkView
from p2plearn.sim.simulator import PlannedSimulator
from p2plearn.sync.compress import Compressor
from p2plearn.sync.exchange import PartExchange
from p2plearn.sync.layout import PartLayout, Slices
from p2plearn.sync.merge import Contribution
from p2plearn.sync.partitioned import RESYNC_ROUNDS


class VirtualPartitioned:
    """The partitioned rounds of a `VirtualTraining` (its replicas, view, links, clocks and policies).
    ``anchors``: every peer's model after the last round ([n, P], kept current by the caller after each
    round's outer step); needed with compression (rounds exchange changes from it), else may be None.
    What arrives of a flow's message is the run's `VirtualTraining.arrivals`."""

    def __init__(self, training, anchors: np.ndarray | None):
        self.training = training
        o = training.options
        rows = training.replicas.numpy()
        mode = None if o.compress == "none" else o.compress
        if mode is not None and anchors is None:
            raise ValueError("compressed partitioned rounds need every peer's anchor")
        self.exchanges = [PartExchange([rows[i]], Compressor(mode, [rows.shape[1]], o.keep_nonfinite) if mode else None,
                                       None if anchors is None else [anchors[i]]) for i in range(training.n)]
        self.scale = training.message_bytes / training.replica_bytes  # network bytes per byte of the replica's
        self._layout: tuple[tuple, PartLayout] | None = None  # the last view's order and layout

    @property
    def message_bytes(self) -> float:
        """A whole model's bytes on the network in a change round's format (what the layout plans)."""
        return self.exchanges[0].wire_bytes([0]) * self.scale

    def round(self, rnd: int, clock: np.ndarray, sizes: np.ndarray,
              view) -> tuple[np.ndarray, dict, dict[str, np.ndarray]]:
        """Round `rnd` with every peer's compute done at clock[i], planned from `view`: the clocks
        after it, its record, and its flows (src, dst, start_s, end_s, delivered, loss, rate, cap)
        for the reports."""
        t = self.training
        exchanges = self.exchanges
        resync = exchanges[0].compressor is not None and rnd % RESYNC_ROUNDS == 0
        scatter_format, gather_format = exchanges[0].formats(resync)
        layout = self._plan(view)
        bounds, _, deadline = t.round_bounds(rnd, sizes, layout.planned_time)
        parts = {k: s for k, s in layout.slices.items() if s}   # aggregator -> its pieces of the row
        bound = np.asarray(bounds, dtype=float)
        bound = bound.min(axis=1) if bound.ndim == 2 else bound  # each sender's smallest bound

        # 1. scatter: every message encoded (error feedback in each sender's order) before any merge
        sent = {(i, k): exchanges[i].scatter(parts[k], resync) for i in layout.ranks for k in parts if k != i}
        scatter = [(i, k, layout.scatter_rate[i][k], self._bytes(a)) for (i, k), a in sent.items()]
        f1, t1, loss1 = self._phase(scatter, clock, sizes, bound, deadline)
        arrival = np.zeros(t.n)
        np.maximum.at(arrival, f1["dst"], t1 + f1["end_s"])
        counts = np.bincount(f1["dst"], minlength=t.n)
        inputs: dict[int, dict[int, list[Contribution]]] = {k: {} for k in parts}
        for i, k, d in zip(f1["src"].tolist(), f1["dst"].tolist(), f1["delivered"].tolist()):
            c = self._arrived(i, k, 2 * rnd, sent[(i, k)], parts[k], scatter_format, d)
            if c is not None:
                inputs[k][i] = c
        averaged = {k: exchanges[k].reduce(parts[k], inputs[k], resync)[0] for k in parts}
        share = np.zeros(t.n)
        share[list(parts)] = [self._bytes(averaged[k]) / self.message_bytes for k in parts]  # of a model, merged per message
        ready = np.maximum(clock, arrival) + t.costs["merge_s"] * share * counts

        # 2. gather
        gather = [(k, j, layout.gather_rate[k][j], self._bytes(averaged[k])) for k in parts for j in layout.ranks
                  if j != k]
        f2, t2, loss2 = self._phase(gather, ready, sizes, bound, deadline)
        end = ready.copy()
        np.maximum.at(end, f1["src"], t1 + f1["end_s"])
        np.maximum.at(end, f2["src"], t2 + f2["end_s"])
        np.maximum.at(end, f2["dst"], t2 + f2["end_s"])
        for k, j, d in zip(f2["src"].tolist(), f2["dst"].tolist(), f2["delivered"].tolist()):
            c = self._arrived(k, j, 2 * rnd + 1, averaged[k], parts[k], gather_format, d)
            if c is not None:
                exchanges[j].place(parts[k], c, gather_format, resync)
        for exchange in exchanges:
            exchange.settle()
        flows = {"src": np.concatenate([f1["src"], f2["src"]]), "dst": np.concatenate([f1["dst"], f2["dst"]]),
                 "start_s": np.concatenate([t1 + f1["start_s"], t2 + f2["start_s"]]),
                 "end_s": np.concatenate([t1 + f1["end_s"], t2 + f2["end_s"]]),
                 "delivered": np.concatenate([f1["delivered"], f2["delivered"]]),
                 "loss": np.concatenate([loss1[f1["dst"]], loss2[f2["dst"]]]),
                 "rate": np.concatenate([f1["rate"], f2["rate"]]), "cap": np.concatenate([f1["cap"], f2["cap"]]),
                 "slow": np.concatenate([f1["slow"], f2["slow"]])}
        record = {"round": rnd, "end_s": float(end.max()), "average_p": float(len(layout.ranks) - 1),
                  "delivered": float(flows["delivered"].mean()) if len(flows["src"]) else 1.0,
                  "merged": float(counts.mean()), "planned_s": layout.planned_time,
                  "slow": int(flows["slow"].sum())}
        return end, record, flows

    def _plan(self, view) -> PartLayout:
        """The round's parts and pacing from the view, cut anew when the view's order changes, as
        training does."""
        if self._layout is None or self._layout[0] != view.order:
            self._layout = (view.order, PartLayout.from_view(view, [self.exchanges[0].flat[0].size], self.message_bytes))
        return self._layout[1]

    def _bytes(self, arrays: list[np.ndarray]) -> float:
        """A message's bytes on the simulated network."""
        return sum(a.nbytes for a in arrays) * self.scale

    def _arrived(self, sender: int, receiver: int, msg_id: int, arrays: list[np.ndarray], slices: Slices,
                 fmt: Compressor | None, delivered: float) -> list[Contribution] | None:
        """What the receiver reads of the sender's message when `delivered` of its chunks arrived."""
        exact = [b == 0.0 for b in (fmt.loss_bounds([1.0] * len(slices)) if fmt is not None else [1.0] * len(arrays))]
        d = self.training.arrivals.delivery(sender, receiver, msg_id, arrays, exact, delivered)
        return None if d is None else self.exchanges[receiver].contributions(d, slices, fmt)

    def _phase(self, flows: list[tuple[int, int, float, float]], start: np.ndarray, sizes: np.ndarray,
               bound: np.ndarray, deadline) -> tuple[dict[str, np.ndarray], float, np.ndarray]:
        """One phase's flows (src, dst, pace, bytes), each sender starting at start[src]: the
        simulator's flows (times from t0), t0, and the receivers' loss."""
        t = self.training
        t0 = float(start.min())
        up, down, loss = t.links.at(t0)
        if not flows:
            empty = {k: np.zeros(0, dtype=int if k in ("src", "dst") else float)
                     for k in ("src", "dst", "start_s", "end_s", "delivered", "rate", "cap", "slow")}
            return empty, t0, loss
        src, dst, cap, nbytes = (np.array(x) for x in zip(*flows))
        plan = {i: dst[src == i].tolist() for i in np.unique(src).tolist()}
        view = NetworkView(up, down, sizes, np.ones(t.n, dtype=bool))
        sim = PlannedSimulator(view, plan, (src.astype(np.int64), dst.astype(np.int64), cap.astype(float),
                                             nbytes.astype(float)),
                                loss=loss, bound=bound, deadline=deadline, slow_close=t.options.slow_close,
                                compute_s=start - t0,
                                links=t.links.from_time(t0))
        f = sim.run(1).flows
        f["src"], f["dst"] = f["src"].astype(int), f["dst"].astype(int)
        return f, t0, loss
