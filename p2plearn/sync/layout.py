"""Parts of a partitioned all-reduce: who aggregates which elements, and how fast each flow goes.

The exchanged arrays, read in order as one sequence of elements, are cut into one contiguous part per
live peer, sized from the view's bandwidths so that every peer's transfers take about as long
(`part_bytes`; a slow peer aggregates a smaller part, down to none). Parts are very sensitive to the
bandwidths (among 4 peers, one 30% slower than the others aggregates a fifth of their part), so they
are cut from the bandwidths less their measured noise (`settled`): on links whose estimates wander
(loopback and hosts whose CPU sets the pace: 10-30% from round to round), the parts stay equal and
put, instead of being cut anew, unequal, with each view. Every peer holding the same view computes
the same `PartLayout`: training's partitioned rounds, the DDP backend's all-reduce and the simulator
all cut with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from p2plearn.selection import PACING_HEADROOM

ALIGN = 64  # part boundaries fall on multiples of this many elements: whole chunks, no sliver parts
# how many times an end's noise (the view's EWMA of |sample - estimate| / estimate) a bandwidth must be
# off the others' median before the parts tell it apart: loopback estimates stray up to ~2.5 times
# their noise from the others' from one view to the next. Tuning: larger keeps parts equal under more
# noise; 0 cuts from the estimates as they are.
NOISE_WIDTH = 3.0

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


def settled(capacity: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Bandwidths as parts are cut from them: each positive one moved towards the median of the
    positive ones (in log scale) by NOISE_WIDTH times its noise, never past it; 0 stays 0. A
    difference within the estimates' noise then moves no part; a larger one keeps what exceeds it."""
    capacity = np.asarray(capacity, dtype=float)
    positive = capacity > 0
    if positive.sum() < 2:
        return capacity
    logs = np.log(capacity[positive])
    off = logs - np.median(logs)
    noise = np.nan_to_num(np.asarray(noise, dtype=float)[positive], nan=0.0, posinf=0.0)  # unknown: none
    width = np.log1p(NOISE_WIDTH * np.maximum(noise, 0.0))
    shrunk = np.sign(off) * np.maximum(np.abs(off) - width, 0.0)
    out = capacity.copy()
    out[positive] = np.where(width > 0, np.exp(np.median(logs) + shrunk), capacity[positive])  # no noise: as is
    return out


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
        noise = np.where(up <= down, np.asarray(view.uplink_noise, dtype=float)[ranks],
                         np.asarray(view.downlink_noise, dtype=float)[ranks])  # the narrower end's
        cut = partition(numels, part_bytes(settled(capacity, noise), model_bytes))
        # pace each flow for its part as cut: on a small model the ALIGN rounding moves a part's size
        # by a large factor, and a part paced for its planned bytes would crawl (or flood)
        m = model_bytes * np.array([sum(end - start for _, start, end in s) for s in cut], dtype=float) / max(sum(numels), 1)
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
