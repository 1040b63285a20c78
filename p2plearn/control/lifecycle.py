"""The life cycle of a control client: one phase, changed only along the allowed transitions.

A client follows a coordinator (as an observer, or as a registered member), looks for it again
when it falls silent (failover), and ends in one of four ways: it left the job, the coordinator
said the job ended, no coordinator answered for ``give_up`` seconds, or it was closed. The caller's
thread and the client's background thread both change the phase, so every change goes through
``Lifecycle.move`` under one lock; a change the current phase does not allow lost a race to
another (closing during a failover, say) and is refused, the phase that won stands.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping

from .errors import ControlError, CoordinatorDead


class Phase(enum.Enum):
    """Where a client is in its life; each phase says what the client does in it."""

    OBSERVING = "observing"            # follows a coordinator, not a member: the launcher, a peer before
                                       # register(), one expelled; looks for a successor, starts none
    MEMBER = "member"                  # follows a coordinator as a registered peer: sends heartbeats, and
                                       # starts the successor when its turn comes
    SEEKING = "seeking"                # an observer looking for its coordinator again
    MEMBER_SEEKING = "member seeking"  # a member looking for its coordinator again; its reports are dropped,
                                       # and it re-registers (hands its state over) where it finds one
    LEFT = "left"                      # leave() was called: follows no successor, still hears the others
                                       # leave (``wait_alone``); register() makes it a member again
    ENDED = "ended"                    # the coordinator said the job ended: nothing more comes, no successor
    DEAD = "dead"                      # no coordinator, not even a successor, answered for give_up seconds
    CLOSED = "closed"                  # close() was called: the sockets are released

    @property
    def member(self) -> bool:
        """Registered: heartbeats go out, and this peer may host the successor."""
        return self in (Phase.MEMBER, Phase.MEMBER_SEEKING)

    @property
    def seeking(self) -> bool:
        """Looking for a (new) coordinator."""
        return self in (Phase.SEEKING, Phase.MEMBER_SEEKING)

    @property
    def in_job(self) -> bool:
        """Takes part in the job: may start or follow a successor."""
        return self in (Phase.OBSERVING, Phase.MEMBER, Phase.SEEKING, Phase.MEMBER_SEEKING)

    @property
    def listening(self) -> bool:
        """The background thread runs: pushed events may still come."""
        return self.in_job or self is Phase.LEFT

    @property
    def over(self) -> bool:
        """No coordinator will speak to this client again: waits on the membership or clock end."""
        return self in (Phase.ENDED, Phase.DEAD)

    @property
    def following(self) -> bool:
        """Not looking for a coordinator, nor past the last one."""
        return not (self.seeking or self.over)


_ENDINGS = frozenset({Phase.LEFT, Phase.ENDED, Phase.CLOSED})
# Every allowed transition, by the phase it leaves. ENDED and DEAD are final: closing such a client
# releases its sockets but keeps the outcome, which its calls go on reporting.
TRANSITIONS: Mapping[Phase, frozenset[Phase]] = {
    Phase.OBSERVING: frozenset({Phase.MEMBER, Phase.SEEKING}) | _ENDINGS,
    Phase.MEMBER: frozenset({Phase.MEMBER, Phase.OBSERVING, Phase.MEMBER_SEEKING}) | _ENDINGS,
    Phase.SEEKING: frozenset({Phase.OBSERVING, Phase.MEMBER_SEEKING, Phase.DEAD}) | _ENDINGS,
    Phase.MEMBER_SEEKING: frozenset({Phase.MEMBER, Phase.MEMBER_SEEKING, Phase.SEEKING, Phase.DEAD}) | _ENDINGS,
    Phase.LEFT: frozenset({Phase.MEMBER, Phase.ENDED, Phase.CLOSED}),
    Phase.ENDED: frozenset(),
    Phase.DEAD: frozenset(),
    Phase.CLOSED: frozenset(),
}
# Transitions that keep whether the client looks for its coordinator and change only whether it is a
# member, and the reverse: keep membership, change the search.
_AS_MEMBER = {Phase.OBSERVING: Phase.MEMBER, Phase.SEEKING: Phase.MEMBER_SEEKING, Phase.LEFT: Phase.MEMBER,
              Phase.MEMBER: Phase.MEMBER, Phase.MEMBER_SEEKING: Phase.MEMBER_SEEKING}
_AS_OBSERVER = {Phase.MEMBER: Phase.OBSERVING, Phase.MEMBER_SEEKING: Phase.SEEKING}
_SEEKING = {Phase.OBSERVING: Phase.SEEKING, Phase.MEMBER: Phase.MEMBER_SEEKING}
_FOUND = {Phase.SEEKING: Phase.OBSERVING, Phase.MEMBER_SEEKING: Phase.MEMBER}


class Lifecycle:
    """A client's phase: read from any thread (``phase``), changed only through ``move`` (or the
    named moves below, each a lookup and a move under the same lock).

    ``cond``: the client's condition, shared with its membership replica, so that a wait on the
    membership or the clock wakes when the client gives up or its job ends.
    """

    def __init__(self, cond: threading.Condition, job_id: str, give_up: float) -> None:
        self._cond = cond
        self._job_id = job_id      # for the errors only
        self._give_up = give_up
        self._phase = Phase.OBSERVING  # written under cond; one reference, so read without it

    @property
    def phase(self) -> Phase:
        return self._phase

    def move(self, to: Phase) -> bool:
        """Change to ``to`` if ``TRANSITIONS`` allows it from the current phase; False if not (the
        phase that won the race stands). Wakes every wait on the client's condition."""
        with self._cond:
            if to not in TRANSITIONS[self._phase]:
                return False
            self._phase = to
            self._cond.notify_all()
            return True

    def _move_by(self, table: Mapping[Phase, Phase]) -> bool:
        with self._cond:
            to = table.get(self._phase)
            return to is not None and self.move(to)

    def admit(self) -> bool:
        """The coordinator admitted this peer (again, after it left or while seeking)."""
        return self._move_by(_AS_MEMBER)

    def expel(self) -> bool:
        """The coordinator no longer counts this peer as a member (a rejoin was refused)."""
        return self._move_by(_AS_OBSERVER)

    def seek(self) -> bool:
        """Start looking for the coordinator; False if this client no longer takes part in the job."""
        return self._move_by(_SEEKING)

    def follow(self) -> bool:
        """Follow the coordinator found (the same one, or a successor)."""
        return self._move_by(_FOUND)

    def leave(self) -> bool:
        """Leave the job; True if this client was a member until now (the coordinator is to be told)."""
        with self._cond:
            was_member = self._phase.member
            return self.move(Phase.LEFT) and was_member

    def check(self, endpoint: str) -> None:
        """Raise what a call on a client in this phase raises: CoordinatorDead, or ControlError once
        the job ended or the client is closed (``endpoint``: the coordinator it followed last)."""
        phase = self._phase
        if phase is Phase.DEAD:
            raise CoordinatorDead(f"no coordinator of job {self._job_id!r} answered for {self._give_up:g} s "
                                  f"(last at {endpoint}), and no successor could be started")
        if phase is Phase.ENDED:
            raise ControlError(f"the coordinator of job {self._job_id!r} stopped: the job ended")
        if phase is Phase.CLOSED:
            raise ControlError("the control client is closed")
