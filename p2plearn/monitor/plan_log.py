"""The coordinator's part of ``--log-dir``: the plan over time and the job's events, as JSON lines.

A coordinator of term T appends to ``DIR/coordinator-T.jsonl`` (a successor writes its own file):
a ``"job"`` line as it starts (the job's id and settings), then a ``"plan"`` line (the view's
version, the clocks, each member's host, clock, loss and the view's uplink and downlink
estimates, and the flows each live sender reported for its last round, with their measured
rates) of the table's snapshot at a tick (every ``--heartbeat``) whose members or flows differ
from the last line's, at most one per ``PLAN_MIN_S`` (a change that comes sooner is held, and its
latest snapshot written once that has passed, or as the log stops, unless a newer change replaced
it), and at least one per ``PLAN_EVERY_S`` (the clocks move);
and one ``"event"`` line per join, leave, death, donation, hand-over and end. The report
(``write_report``) draws the plan over time from them.

As the ``JobRecord``, it is fed on the coordinator's serving thread (``observe``, ``published``:
an append to a bounded deque) and writes on a thread of its own, every ``WRITE_EVERY_S``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from typing import Any

from .record import EVENTS, WATCHED, describe, plan_edges

PLAN_MIN_S = 1.0     # seconds between plan lines at least (a line is ~40 B per flow and ~120 B per member)
PLAN_EVERY_S = 10.0  # seconds between plan lines at most, while the plan stays the same
WRITE_EVERY_S = 1.0  # how often the file is written (what a killed coordinator loses at most)
SNAPSHOTS = 64       # ticks held unwritten at most (WRITE_EVERY_S / the heartbeat, with room)


def coordinator_file(log_dir: str, term: int) -> str:
    return os.path.join(log_dir, f"coordinator-{term}.jsonl")


class PlanLog:
    """Write the plans and events of a coordinator of term ``term`` to ``log_dir`` until ``stop()``;
    ``job_id`` and ``settings`` (shown as they are) go in its first line."""

    def __init__(self, log_dir: str, term: int, job_id: str = "", settings: dict[str, Any] | None = None) -> None:
        os.makedirs(log_dir, exist_ok=True)
        self.term = term
        self._snapshots: deque[tuple[float, dict[str, Any]]] = deque(maxlen=SNAPSHOTS)  # (when, snapshot)
        self._last_shape: tuple[frozenset, frozenset] | None = None  # this thread's: the last line's members and flows
        self._last_time = 0.0
        self._held: tuple | None = None  # this thread's: the latest change not yet written (when, snap, edges, shape)
        self._events: deque[tuple[float, str, dict]] = deque(maxlen=EVENTS)
        self._file = open(coordinator_file(log_dir, term), "a", encoding="utf-8")
        self._line({"kind": "job", "time": round(time.time(), 3), "clock": "wall", "job_id": job_id, "term": term,
                    "settings": settings or {}})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="p2plearn-plan-log", daemon=True)

    def start(self) -> PlanLog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    # -- the coordinator's thread (lock held): O(1) each ----------------------------------------------

    def observe(self, snapshot: dict[str, Any]) -> None:
        self._snapshots.append((time.time(), snapshot))

    def published(self, publication: Any) -> None:
        if publication.kind in WATCHED:
            self._events.append((time.time(), publication.kind, publication.body))

    def reported(self, *report: Any) -> None:
        pass  # the plan line carries the members' figures; each round's are in the ranks' own logs

    # -- this thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.wait(WRITE_EVERY_S):
                self._write()
        finally:
            self._write()
            self._file.close()

    def _write(self) -> None:
        while self._events:
            when, kind, body = self._events.popleft()
            self._line({"kind": "event", "time": round(when, 3), "term": self.term, "text": describe(kind, body)})
        while self._snapshots:
            when, snap = self._snapshots.popleft()
            edges = plan_edges(snap)
            shape = (frozenset(snap["members"]), frozenset((e["src"], e["dst"]) for e in edges))
            if shape != self._last_shape:
                self._held = (when, snap, edges, shape)  # a change: written once PLAN_MIN_S allows
            elif when - self._last_time >= PLAN_EVERY_S:
                self._held = None  # back to the last line's shape before it was written: nothing changed
                self._write_plan(when, snap, edges, shape)
        if self._held is not None and (self._stop.is_set() or time.time() - self._last_time >= PLAN_MIN_S):
            self._write_plan(*self._held)  # at its own time; at the end, the job as the coordinator last saw it
        self._file.flush()

    def _write_plan(self, when: float, snap: dict[str, Any], edges: list[dict[str, Any]], shape: tuple) -> None:
        self._line(plan_line(snap, when, edges))
        self._held, self._last_shape, self._last_time = None, shape, when

    def _line(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")


def plan_line(snap: dict[str, Any], when: float, edges: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``"plan"`` line of a snapshot (``MembershipTable.watch``) and its ``plan_edges``."""
    view, progress = snap["view"], snap["progress"].to_dict()
    members = {str(r): {"host": m["host"], "clock": m["clock"], "loss": m["loss"], "uplink": float(view.uplink[r]),
                        "downlink": float(view.downlink[r])} for r, m in sorted(snap["members"].items())}
    return {"kind": "plan", "time": round(when, 3), "term": snap["term"], "view_version": view.version,
            "min_clock": progress.get("min_clock"), "max_clock": progress.get("max_clock"), "members": members,
            "edges": [[e["src"], e["dst"], e["rate"], e["paced"]] for e in edges]}
