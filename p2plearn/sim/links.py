"""A topology's links over time, as the simulator's flows see them: base rates and loss, with the
events (bursts) that change them while a run goes on."""
from __future__ import annotations

import math

import numpy as np

from p2plearn.topology import Topology
from p2plearn.topology.topology import BYTES_PER_MBIT


class LinkSchedule:
    """A topology's links over time: per rank (a node with `slots` gives that many ranks), its
    uplink and downlink (bytes/s) and loss with the events (bursts) active at t applied (a later
    event of a node over an earlier one). Vectorised over nodes: thousands of bursting peers
    change links many times a round."""

    FIELDS = ("uplink_mbit", "downlink_mbit", "loss")

    def __init__(self, topology: Topology):
        nodes = topology.peers
        self.slots = np.array([topology.slots(p) for p in nodes])
        self.base = {k: np.array([topology.base_link(p)[k] for p in nodes], dtype=float) for k in self.FIELDS}
        events = [topology.events(p) for p in nodes]
        # one group per event position (a node's k-th event), arrays over the nodes that have one
        self.groups = []
        for k in range(max((len(e) for e in events), default=0)):
            have = [i for i, e in enumerate(events) if len(e) > k]
            ev = [events[i][k] for i in have]
            self.groups.append({
                "node": np.array(have), "at": np.array([e.at_s for e in ev]),
                "every": np.array([e.every_s or math.inf for e in ev]),
                "duration": np.array([e.duration_s for e in ev]),
                "until": np.array([math.inf if e.until_s is None else e.until_s for e in ev]),
                **{f: np.array([e.changes.get(f, math.nan) for e in ev]) for f in self.FIELDS}})

    def at(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        link = {k: v.copy() for k, v in self.base.items()}
        for g in self.groups:
            start = _last_start(g, t)
            on = ~np.isnan(start) & (t < start + g["duration"])
            for f in self.FIELDS:
                changed = on & ~np.isnan(g[f])
                link[f][g["node"][changed]] = g[f][changed]
        up, down, loss = (np.repeat(link[f], self.slots) for f in self.FIELDS)
        return up * BYTES_PER_MBIT, down * BYTES_PER_MBIT, loss

    def next_change(self, t: float) -> float:
        """The first time after t at which an event begins or ends (inf: none)."""
        return min((_next_boundary(g, t) for g in self.groups), default=math.inf)

    def from_time(self, t0: float):
        """The links as `Simulator(links=...)` takes them, its time 0 being t0: t -> (uplink,
        downlink, the next change after t)."""
        def links(t: float) -> tuple[np.ndarray, np.ndarray, float]:
            at = t0 + t
            after = self.next_change(at)
            while after - at <= 1e-9 * max(1.0, abs(at)):  # t is a change, rounded short of it by t0's offset
                at, after = after, self.next_change(after)
            up, down, _ = self.at(at)
            return up, down, after - t0
        return links


def _last_start(g: dict[str, np.ndarray], t: float) -> np.ndarray:
    """When each event last began at or before t (nan: not yet, or its repeats ended)."""
    with np.errstate(invalid="ignore"):
        k = np.where(np.isfinite(g["every"]), np.floor((t - g["at"]) / g["every"]), 0.0)
        start = g["at"] + k * np.where(np.isfinite(g["every"]), g["every"], 0.0)
    return np.where((t >= g["at"]) & (start < g["until"]), start, np.nan)


def _next_boundary(g: dict[str, np.ndarray], t: float) -> float:
    """The first time after t at which one of the events begins or ends (inf: never again)."""
    repeats = np.isfinite(g["every"])
    with np.errstate(invalid="ignore"):
        k = np.where(repeats & (t >= g["at"]), np.floor((t - g["at"]) / g["every"]), 0.0)
    out = np.full(len(g["at"]), math.inf)
    for j in (k, k + 1):  # k or k + 1: floor may round either way
        start = g["at"] + j * np.where(repeats, g["every"], 0.0)
        valid = (start < g["until"]) & (repeats | (j == 0))
        for b in (start, start + g["duration"]):
            out = np.where(valid & (b > t), np.minimum(out, b), out)
    return float(out.min(initial=math.inf))
