"""JobRecord: what the monitor knows of a job, kept from the coordinator's snapshots and broadcasts.

The coordinator feeds it on its serving thread, with its lock held, and must not be slowed: each
feed only stores a reference or appends to a bounded deque (``observe``, ``published``,
``reported``). The monitor's own thread folds what was fed into the record (``update``): the
peers, departed ones included (dead or left), a loss curve per peer, the plan's edges as the
senders last reported them, a timeline of each peer's last rounds (compute, then communication,
as reported), each peer's counters (deadline hits, slow closes, drops by reason), the events and
a few counters. Everything is bounded: ``CURVE_POINTS`` points per peer (halved by dropping
every other point when full, so a long run keeps its whole shape), ``TIMELINE_ROUNDS`` rounds per
peer, ``EVENTS`` events, ``REPORTS`` reports between two folds (a coordinator hearing more in a
fold's 0.25 s leaves the oldest out of the timeline), and one row per rank the job ever had.

A successor coordinator starts a new record: the page shows the curves from the failover on.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Any

from ..control import protocol as p

CURVE_POINTS = 512  # per peer; raise it for longer curves (each point is two numbers in every poll)
EVENTS = 200        # the latest events kept (joins, deaths, leaves, donations, failovers; not each view:
                    # its version may change every round, and the page's summary shows it)
TIMELINE_ROUNDS = 24  # per peer: the last rounds drawn on the page's timeline
REPORTS = 4096        # reports held between two folds at most (64 peers x 64 rounds/s)
WATCHED = (p.MEMBER, p.DONATE, p.MOVED, p.ENDED)  # the broadcasts that are events
MEMBER_EVENTS = {"join": "joined", "leave": "left", "dead": "declared dead",
                 "update": "registered a new engine address"}


class JobRecord:
    """The monitor's model of one job (see the module docstring for who calls what).

    - ``settings``: the job's settings as the coordinator knows them (shown as they are).
    - ``phi_threshold``: a live peer whose suspicion (phi) is at least half of it is shown
      "suspected": silent for longer than its heartbeats usually are, not yet declared dead.
    """

    def __init__(self, settings: dict[str, Any], *, phi_threshold: float = 8.0) -> None:
        self.settings = dict(settings)
        self.suspect_phi = phi_threshold / 2
        # Fed by the coordinator's thread: the latest snapshot (a reference swap) and the events.
        self._latest: dict[str, Any] | None = None
        self._inbox: deque[tuple[float, str, dict]] = deque(maxlen=EVENTS)
        self._reports: deque[tuple[float, int, int, float | None, dict, dict]] = deque(maxlen=REPORTS)
        # The monitor thread's own, from here on.
        self._folded: dict[str, Any] | None = None
        self.version = 0  # bumped by every update that changed something (the page's JSON is cached per version)
        self.peers: dict[int, dict[str, Any]] = {}  # rank -> its row, departed ranks included
        self._gone: dict[int, int] = {}  # a departed rank -> the membership epoch of its departure
        self.curves: dict[int, list[tuple[int, float]]] = {}  # rank -> (clock, loss) points
        self.edges: list[dict[str, Any]] = []  # the live senders' last reported flows
        self.timeline: dict[int, deque[tuple[float, int, float, float]]] = {}  # rank -> (end, round, compute, comm)
        self.counts: dict[int, dict[str, int]] = {}  # rank -> its counters over the job, as last reported
        self.events: deque[tuple[float, str]] = deque(maxlen=EVENTS)
        self.event_counts: Counter[str] = Counter()  # by kind: join, leave, dead, update, donate, moved, ended
        self.reported_bytes = 0.0  # estimated: rounds each peer completed x its message bytes x its receivers
        self.progress: dict[str, Any] = {}
        self.view: dict[str, Any] = {}

    # -- the coordinator's thread (lock held): O(1) each -------------------------------------------

    def observe(self, snapshot: dict[str, Any]) -> None:
        """The table's latest snapshot (``MembershipTable.watch``), taken every coordinator tick."""
        self._latest = snapshot

    def published(self, publication: Any) -> None:
        """A broadcast (``control.table.Publication``): the ones that are events are kept."""
        if publication.kind in WATCHED:
            self._inbox.append((time.time(), publication.kind, publication.body))

    def reported(self, rank: int, clock: int, comm_s: float | None, load: dict, counts: dict) -> None:
        """A member's round report, as the coordinator read it (``control.fields``): its clock, the
        round's communication time, its load (``compute_s``: its work before the round) and counters."""
        self._reports.append((time.time(), rank, clock, comm_s, load, counts))

    # -- the monitor's thread ----------------------------------------------------------------------

    def update(self) -> bool:
        """Fold in what the coordinator fed since the last call; True if anything changed."""
        changed = False
        while self._inbox:
            self._event(*self._inbox.popleft())
            changed = True
        while self._reports:
            self._report(*self._reports.popleft())
            changed = True
        latest = self._latest
        if latest is not None and latest is not self._folded:
            self._fold(latest)
            self._folded = latest
            changed = True
        if changed:
            self.version += 1
        return changed

    def state_counts(self) -> Counter[str]:
        """Peers by state: alive, suspected, dead, left."""
        return Counter(row["state"] for row in self.peers.values())

    def to_json(self) -> dict[str, Any]:
        """What the page shows, as one JSON object."""
        return {"version": self.version, "time": time.time(), "settings": self.settings, "progress": self.progress,
                "view": self.view, "peers": [self.peers[r] for r in sorted(self.peers)], "edges": self.edges,
                "curves": {str(r): points for r, points in sorted(self.curves.items())},
                "timeline": {str(r): list(rounds) for r, rounds in sorted(self.timeline.items())},
                "events": list(self.events)}

    def _event(self, when: float, kind: str, body: dict) -> None:
        self.event_counts[body.get("event", kind) if kind == p.MEMBER else kind] += 1
        if kind == p.MEMBER:
            rank, event = body.get("member", {}).get("rank"), body.get("event")
            if event in ("leave", "dead") and rank in self.peers:
                self.peers[rank]["state"] = "left" if event == "leave" else "dead"
                self._gone[rank] = body.get("epoch", 0)
        self.events.appendleft((when, describe(kind, body)))

    def _report(self, when: float, rank: int, clock: int, comm_s: float | None, load: dict, counts: dict) -> None:
        rounds = self.timeline.setdefault(rank, deque(maxlen=TIMELINE_ROUNDS))
        if rounds and rounds[-1][1] >= clock:
            rounds.clear()  # a clock that went back: a restarted peer's rounds start anew
        rounds.append((when, clock, load.get("compute_s", 0.0), comm_s or 0.0))
        if counts:
            self.counts[rank] = counts

    def _fold(self, snap: dict[str, Any]) -> None:
        view, members, phi = snap["view"], snap["members"], snap["phi"]
        for rank, member in members.items():
            if self._gone.get(rank, -1) >= snap["epoch"]:
                continue  # a snapshot taken before its departure: still gone
            self._gone.pop(rank, None)  # back in the job since
            row = self.peers.get(rank)
            if row is not None and row["state"] in ("alive", "suspected") and member["clock"] > row["clock"]:
                self.reported_bytes += ((member["clock"] - row["clock"]) * float(view.message_bytes[rank])
                                        * len(snap["links"].get(rank, ())))
            self.peers[rank] = self._row(member, view, phi.get(rank, 0.0))
            if member["loss"] is not None:
                self._add_point(rank, member["clock"], member["loss"])
        for rank, row in self.peers.items():
            if rank not in members and row["state"] in ("alive", "suspected"):
                row["state"] = "dead"  # gone without an event seen (one pushed out of a full inbox)
        self.edges = plan_edges(snap)
        self.progress = snap["progress"].to_dict()
        self.view = {"version": view.version, "from_round": view.from_round, "round": view.round,
                     "term": snap["term"], "epoch": snap["epoch"]}

    def _row(self, member: dict[str, Any], view: Any, phi: float) -> dict[str, Any]:
        r = member["rank"]
        return {"rank": r, "host": member["host"], "state": "suspected" if phi >= self.suspect_phi else "alive",
                "phi": round(min(phi, 300.0), 2), "clock": member["clock"], "loss": member["loss"],
                "uplink": float(view.uplink[r]), "downlink": float(view.downlink[r]),
                "compute_s": float(view.compute_s[r]), "comm_s": member["step_time"], "merge_s": float(view.merge_s[r]),
                "backlog": float(view.backlog[r]), "in_flight_bytes": float(view.in_flight_bytes[r]),
                "message_bytes": float(view.message_bytes[r])}

    def _add_point(self, rank: int, clock: int, loss: float) -> None:
        points = self.curves.setdefault(rank, [])
        if points and points[-1][0] >= clock:
            return  # no new round since the last point
        if len(points) >= CURVE_POINTS:
            del points[1::2]  # keep the whole run's shape at half the resolution
        points.append((clock, loss))


def describe(kind: str, body: dict) -> str:
    """One line for a broadcast that is an event (``WATCHED``)."""
    if kind == p.MEMBER:
        event = body.get("event")
        return f"rank {body.get('member', {}).get('rank')} {MEMBER_EVENTS.get(event, event)}"
    if kind == p.DONATE:
        return f"rank {body.get('to')} sends the model state to rank {body.get('rank')} (round {body.get('clock')})"
    if kind == p.MOVED:
        return f"a successor took over (term {body.get('term')}) at {body.get('endpoint')}"
    return "the job ended"


def plan_edges(snap: dict[str, Any]) -> list[dict[str, Any]]:
    """A snapshot's plan as it ran: the flows each live sender reported for its last round, between members."""
    members = snap["members"]
    return [{"src": src, "dst": dst, "rate": flow["rate"], "paced": flow["paced"], "multicast": flow["multicast"]}
            for src, flows in sorted(snap["links"].items()) if src in members
            for dst, flow in sorted(flows.items()) if dst in members]
