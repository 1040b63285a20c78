"""Partitioned rounds in virtual time (`--sync partitioned`): `sync.partitioned`'s two phases, each
a flow-level round on the simulated network, with the layout training computes.

Round r, from the view that plans it (`PartLayout.from_view`: parts sized so that every peer's
transfers take about as long, and each flow's pace):
1. scatter: every peer sends part k of its model to peer k, starting when its compute ends;
2. peer k averages the part-k values that arrived with its own (the C merge, chunk masks) once
   every scatter message to it arrived or was cut, then sends the result to every other peer;
   each puts it in place where its chunks arrived (a lost piece keeps the peer's own value).
A peer's round ends when its sends are done and the parts sent to it arrived; then the outer
step. The model is one sequence of elements (the replica's row), cut as training cuts the
exchanged tensors read in order. Loss bounds: each sender's smallest (per-layer bounds are refused
with this mode, as with compression); the deadline and the slow close apply to each phase.
"""
from __future__ import annotations

import math

import numpy as np

from p2plearn.selection import NetworkView
from p2plearn.selection.view import DATAGRAM_DATA
from p2plearn.sim.simulator import PlannedSimulator
from p2plearn.sync.merge import Contribution, merge_parameter
from p2plearn.sync.partitioned import PartLayout
from p2plearn.transport.delivery import ChunkMask


class VirtualPartitioned:
    """The partitioned rounds of a `VirtualTraining` (its replicas, view, links, clocks and policies)."""

    def __init__(self, training):
        self.training = training

    def round(self, rnd: int, clock: np.ndarray, sizes: np.ndarray,
              view) -> tuple[np.ndarray, dict, dict[str, np.ndarray]]:
        """Round `rnd` with every peer's compute done at clock[i], planned from `view`: the clocks
        after it, its record, and its flows (src, dst, start_s, end_s, delivered, loss, rate, cap)
        for the reports."""
        t = self.training
        rows = t.replicas.numpy()
        total = rows.shape[1]
        layout = PartLayout.from_view(view, [total], t.message_bytes)
        bounds, _, deadline = t.round_bounds(rnd, sizes, layout.planned_time)
        parts = {k: (s[0][1], s[0][2]) for k, s in layout.slices.items() if s}   # aggregator -> elements [a, b)
        part_bytes = {k: (b - a) / total * t.message_bytes for k, (a, b) in parts.items()}
        snapshot = rows.copy()  # what the scatter carries: every model as its round began
        bound = np.asarray(bounds, dtype=float)
        bound = bound.min(axis=1) if bound.ndim == 2 else bound  # each sender's smallest bound

        # 1. scatter
        scatter = [(i, k, layout.scatter_rate[i][k], part_bytes[k]) for i in layout.ranks for k in parts if k != i]
        f1, t1, loss1 = self._phase(scatter, clock, sizes, bound, deadline)
        arrival = np.zeros(t.n)
        np.maximum.at(arrival, f1["dst"], t1 + f1["end_s"])
        counts = np.bincount(f1["dst"], minlength=t.n)
        inputs: dict[int, list[Contribution]] = {}
        for i, k, d in zip(f1["src"].tolist(), f1["dst"].tolist(), f1["delivered"].tolist()):
            a, b = parts[k]
            inputs.setdefault(k, []).append(Contribution(snapshot[i, a:b], chunks=self._mask(d, b - a, part_bytes[k])))
        for k, contributions in inputs.items():
            a, b = parts[k]
            merge_parameter(rows[k, a:b], contributions)
        share = np.array([part_bytes.get(k, 0.0) / t.message_bytes for k in range(t.n)])
        ready = np.maximum(clock, arrival) + t.costs["merge_s"] * share * counts

        # 2. gather
        gather = [(k, j, layout.gather_rate[k][j], part_bytes[k]) for k in parts for j in layout.ranks if j != k]
        f2, t2, loss2 = self._phase(gather, ready, sizes, bound, deadline)
        end = ready.copy()
        np.maximum.at(end, f1["src"], t1 + f1["end_s"])
        np.maximum.at(end, f2["src"], t2 + f2["end_s"])
        np.maximum.at(end, f2["dst"], t2 + f2["end_s"])
        for k, j, d in zip(f2["src"].tolist(), f2["dst"].tolist(), f2["delivered"].tolist()):
            a, b = parts[k]
            np.copyto(rows[j, a:b], rows[k, a:b], where=self._elements(d, b - a, part_bytes[k]))
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

    def _chunks(self, elements: int, nbytes: float) -> tuple[int, int]:
        """A part's chunks on the network: (count, bytes of the replica's part per chunk)."""
        count = max(1, math.ceil(nbytes / DATAGRAM_DATA))
        return count, max(1, math.ceil(elements * 4 / count))

    def _arrived(self, delivered: float, count: int) -> np.ndarray:
        arrived = np.zeros(count, dtype=bool)
        arrived[self.training.mask_rng.permutation(count)[:int(delivered * count)]] = True
        return arrived

    def _mask(self, delivered: float, elements: int, nbytes: float) -> ChunkMask | None:
        """The chunks of a part's message that arrived, the missing ones at random."""
        if delivered >= 1.0:
            return None
        count, chunk_size = self._chunks(elements, nbytes)
        return ChunkMask(self._arrived(delivered, count), 0, chunk_size)

    def _elements(self, delivered: float, elements: int, nbytes: float) -> np.ndarray | bool:
        """Which elements of a part's message arrived (True: all)."""
        if delivered >= 1.0:
            return True
        count, chunk_size = self._chunks(elements, nbytes)
        return self._arrived(delivered, count)[np.arange(elements) * 4 // chunk_size]
