"""The membership table's global view: what each rank reported that planning reads, and which version is published.

Not thread-safe: the table calls it (the coordinator with its lock held, the simulator on its own thread).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from .estimator import BandwidthEstimator
from .fields import LOAD
from .membership import Member
from .view import PLANNING_INPUTS, GlobalView, domains_from_reach, reach_of

VIEW_LEAD = 2        # a new view applies this many rounds after the fastest reported clock


class JobView:
    """Per rank, the inputs of the job's `GlobalView` (bandwidths through the estimator, message
    sizes, load, multicast reach, last reported flows), and the versions published from them.

    - ``world_size``: the initial size (the view has at least this many entries; ``grow`` adds).
    - ``rates``: ``{rank: (uplink, downlink)}`` in bytes/s seeding the bandwidth estimator.
    - ``term``: the coordinator's incarnation, stamped on every view.
    """

    def __init__(self, world_size: int, rates: Mapping[int, tuple[float, float]] | None, term: int) -> None:
        self.term = term
        self.estimator = BandwidthEstimator(rates)
        self.size = world_size  # entries in the view: the highest rank ever seen + 1
        self.message_bytes: dict[int, float] = {}
        self.load: dict[int, dict[str, float]] = {}  # rank -> its latest reported load (fields.LOAD)
        self.reach: dict[int, set[int]] = {}  # rank -> the ranks its multicast probe reached
        self.links: dict[int, dict[int, dict[str, Any]]] = {}  # rank -> its last report's flows (for a monitor)
        self.most_planned = 0  # the most receivers a published view planned, ever
        self._published: GlobalView | None = None
        self._version = 0
        self._from = 0

    def grow(self, rank: int) -> None:
        """``rank`` is (or was) in the job: the view has an entry for it."""
        self.size = max(self.size, rank + 1)

    def record(self, rank: int, clock: int, message_bytes: float | None, links: dict[int, dict[str, Any]],
               load: dict[str, float]) -> None:
        """What a member's report of round ``clock`` brings the view."""
        if message_bytes:
            self.message_bytes[rank] = message_bytes
        self.estimator.observe(rank, clock, links)
        self.links[rank] = links
        self.load[rank] = load

    def forget(self, rank: int) -> None:
        """``rank`` left the job: what it computed and received no longer loads anyone."""
        self.load.pop(rank, None)
        self.links.pop(rank, None)
        self.forget_reach(rank)

    def forget_reach(self, rank: int) -> None:
        """``rank`` is gone or moved its engine: nobody's probe has reached it since."""
        self.reach.pop(rank, None)
        for reached in self.reach.values():
            reached.discard(rank)

    def adopt(self, view: GlobalView) -> None:
        """A successor's hand-over: the view its sender held seeds the inputs until peers report again."""
        self.estimator.seed({name: getattr(view, name) for name in
                             ("uplink", "downlink", "uplink_target", "downlink_target")})
        self.size = max(self.size, view.size)
        self.message_bytes.update({r: float(b) for r, b in enumerate(view.message_bytes) if b > 0})
        self.reach = reach_of(view.mcast_domain)  # until peers report again: what the domains say

    def current(self, members: Mapping[int, Member], min_clock: int) -> GlobalView:
        """The view as things stand (the published one may plan with older inputs: ``publish``)."""
        alive = np.zeros(self.size, dtype=bool)
        clock = np.zeros(self.size, dtype=np.int64)
        for r, m in members.items():
            # Planned as a receiver only once its engine is known: before that, a peer that knew
            # the member but not its engine would skip it while the member waited for its message.
            alive[r], clock[r] = m.engine is not None, m.clock
        sizes = np.array([self.message_bytes.get(r, 0.0) for r in range(self.size)])
        load = {name: np.array([self.load.get(r, {}).get(name, 0.0) for r in range(self.size)]) for name in LOAD}
        reach = {r: self.reach[r] for r in members if r in self.reach}
        return GlobalView(round=min_clock, alive=alive, clock=clock, message_bytes=sizes,
                          mcast_domain=domains_from_reach(reach, self.size), term=self.term,
                          version=self._version, from_round=self._from,
                          **self.estimator.arrays(self.size), **load)

    def publish(self, members: Mapping[int, Member], min_clock: int, max_clock: int) -> GlobalView:
        """The view to push now: a new version when a planning input changed materially
        (``plans_like``), applying from a round the fastest peer has not planned yet (before the
        first round: from round 0, unless a peer reported its multicast reach: it starts its
        rounds right after, while others may still be probing); else the published version with
        its planning inputs, and what else is new."""
        view = self.current(members, min_clock)
        if view.plans_like(self._published):
            view = replace(view, **{name: getattr(self._published, name) for name in PLANNING_INPUTS})
        else:
            self._version += 1
            self._from = max_clock + VIEW_LEAD if max_clock or self.reach else 0
            view = self.current(members, min_clock)
        self._published = view
        self.most_planned = max(self.most_planned, int(view.alive.sum()))
        return view

