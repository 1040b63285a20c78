"""A control client's copy of what its coordinator pushes: the membership, the slowest live clock,
the global views and the job's progress.

The background thread applies the pushed events (and the snapshots a registration or a resync
returns); the synchronizers read it on every round without asking anyone. A missed membership
event (its epoch skips one) is noted, and the next tick asks for a whole snapshot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from . import protocol as p
from .progress import Progress
from .errors import ControlError
from .lifecycle import Lifecycle, Phase
from .membership import Member
from .requester import WAIT_NOTICE_S
from .view import GlobalView, ViewHistory

log = logging.getLogger("p2plearn.control")


class MembershipReplica:
    """The membership, clock, views and progress as last pushed, and the waits on them.

    ``cond`` guards every field and is shared with ``lifecycle``: a wait wakes when the client
    gives up on its coordinator or the job ends, and then raises what ``check`` raises.
    """

    def __init__(self, cond: threading.Condition, lifecycle: Lifecycle, check: Callable[[], None]) -> None:
        self._cond = cond
        self._life = lifecycle
        self._check = check
        self._members: dict[int, Member] = {}
        self._epoch = -1          # the coordinator's membership epoch applied last (-1: none yet)
        self._gap = False         # an event was missed since: the next tick asks for a snapshot
        self._min_clock = 0
        self._views = ViewHistory()
        self._progress: Progress | None = None
        # The most members, and receivers a view planned, at once since this client followed its
        # coordinator (as seen here, or as the coordinator's snapshots say: events published before
        # this client's subscription was live never come): a start-up wait is over once they reached
        # the job size, even if fast peers finished and left before this peer's thread looked (on a
        # busy host it may sleep for seconds).
        self._most_members = 0
        self._most_planned = 0

    # -- reads (any thread) ---------------------------------------------------------------------

    @property
    def members(self) -> dict[int, Member]:
        with self._cond:
            return dict(self._members)

    @property
    def epoch(self) -> int:
        with self._cond:
            return self._epoch

    @property
    def min_clock(self) -> int:
        with self._cond:
            return self._min_clock

    @property
    def progress(self) -> Progress | None:
        with self._cond:
            return self._progress

    @property
    def view(self) -> GlobalView | None:
        with self._cond:
            return self._views.newest

    def view_for(self, round: int) -> GlobalView | None:
        with self._cond:
            return self._views.for_round(round)

    # -- updates (the background thread; the caller's at registration) --------------------------

    def tick(self, epoch: int, min_clock: int, progress: Progress | None) -> bool:
        """The coordinator's periodic tick; True if the membership held here is stale (an event was
        missed, or none was ever had) and a snapshot should be asked for."""
        with self._cond:
            stale = self._gap or epoch > self._epoch
            self.set_min_clock(min_clock)
            self._progress = progress or self._progress
        return stale

    def member_event(self, event: str, member: Member, epoch: int) -> bool:
        """A pushed join, update, leave or death; False if a snapshot already held it."""
        with self._cond:
            if epoch <= self._epoch:
                return False
            # An event was missed in between: the next tick resyncs the whole membership.
            self._gap = self._gap or epoch != self._epoch + 1
            self._epoch = epoch
            if event in ("join", "update"):
                self._members[member.rank] = member
            else:
                self._members.pop(member.rank, None)
            self._most_members = max(self._most_members, len(self._members))
            self._cond.notify_all()
        return True

    def apply_snapshot(self, members: dict[int, Member], epoch: int, min_clock: int, most_members: int,
                       most_planned: int) -> None:
        """A whole membership (``snapshot`` checks one from the wire); an older one than held is ignored."""
        with self._cond:
            if epoch < self._epoch:
                return
            self._epoch = epoch
            self._gap = False
            self._members = members
            self._most_members = max(self._most_members, len(self._members), most_members)
            self._most_planned = max(self._most_planned, most_planned)
            self.set_min_clock(min_clock)
            self._cond.notify_all()

    def add_view(self, view: GlobalView) -> None:
        with self._cond:
            self._views.add(view)
            self._most_planned = max(self._most_planned, int(view.alive.sum()))
            self._cond.notify_all()

    def set_min_clock(self, clock: int) -> None:
        with self._cond:
            if clock != self._min_clock:
                self._min_clock = clock
                self._cond.notify_all()

    def peaked(self, most_members: int, most_planned: int) -> None:
        """The most members and planned receivers the job had at once, as its coordinator says."""
        with self._cond:
            self._most_members = max(self._most_members, most_members)
            self._most_planned = max(self._most_planned, most_planned)

    def restart(self) -> None:
        """A new coordinator is followed: it numbers its own membership events, and rebuilds the membership."""
        with self._cond:
            self._epoch = -1
            self._most_members = self._most_planned = 0

    # -- waits (the caller's thread) --------------------------------------------------------------

    def wait_min_clock(self, target: int, timeout: float) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self._min_clock >= target or self._life.phase.over, timeout)
            self._check()
            return self._min_clock >= target

    def wait_members(self, count: int, timeout: float, receiving: bool, rank: int | None) -> dict[int, Member]:
        def started() -> bool:
            return self._most_members >= count and (not receiving or self._most_planned >= count)

        def ready() -> bool:
            return self._life.phase.over or started()

        def awaited() -> str:
            missing = sorted(set(range(count)) - set(self._members))
            if missing:
                return f"ranks {missing} to register ({len(self._members)} of {count} have)"
            silent = sorted(r for r, m in self._members.items() if m.engine is None)
            return f"ranks {silent} to start their engines" if silent else "a view that plans every rank"

        start = time.monotonic()
        with self._cond:
            while not self._cond.wait_for(ready, min(WAIT_NOTICE_S, start + timeout - time.monotonic())):
                waited = time.monotonic() - start
                if waited >= timeout:
                    raise ControlError(f"still waiting for {awaited()} after {timeout:g} s")
                if rank == 0:  # one line for the job, not one per rank
                    log.warning("p2plearn: waiting for %s after %.0f s", awaited(), waited)
            if self._life.phase is Phase.DEAD or not started():
                self._check()
            return dict(self._members)

    def wait_alone(self, rank: int | None, timeout: float) -> bool:
        return self._wait_for(lambda: all(r == rank for r in self._members), timeout)

    def wait_left(self, ranks: Iterable[int], timeout: float) -> bool:
        ranks = set(ranks)
        return self._wait_for(lambda: ranks.isdisjoint(self._members), timeout)

    def _wait_for(self, members_done: Callable[[], bool], timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._life.phase.over or members_done(), timeout)


def snapshot(body: dict) -> tuple[dict[int, Member], int, int, int, int]:
    """A membership snapshot from the wire, checked: (members by rank, epoch, min clock, the most
    members and planned receivers the coordinator ever had at once)."""
    members = body.get("members")
    if not isinstance(members, list):
        raise p.BadField("members must be a list")
    return ({m.rank: m for m in map(Member.from_dict, members)}, p.integer(body.get("epoch"), "epoch"),
            p.integer(body.get("min_clock"), "min_clock"),
            *(p.integer(body.get(name, 0), name, 0, p.MAX_RANK + 1) for name in ("most_members", "most_planned")))
