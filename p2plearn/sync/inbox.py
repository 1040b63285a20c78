"""Deliveries from the engine, kept by (round, sender) until the synchronizer merges them."""
from __future__ import annotations

import struct
import time
from collections import Counter, defaultdict
from typing import Callable

from p2plearn.protocols import DeliverySource
from p2plearn.transport import Delivery

STATE_FLAG = 1 << 31  # message ids with this bit carry a whole model state (join, final average), not a round
# (0xFFFFFF00-0xFFFFFFFE, state ids of clocks no job reaches, are the Channel's multicast probes')
MAX_STATES = 4        # model states kept unasked for, at least: one per sender (a donor's newest, a final model)
# What a channel raises about one delivery's content (a descriptor it cannot map, a size that does
# not fit: a peer's bug or a hostile key holder): that delivery is lost, the next ones are not. A
# closed or failed channel raises otherwise (TransportError, an OSError) and ends the round.
UNUSABLE = (ValueError, TypeError, IndexError, KeyError, OverflowError, struct.error)


class Inbox:
    """Pulls deliveries off a channel and files them; rounds may arrive early (faster peers).

    ``wanted()`` gives the rounds (first, last) worth keeping now; deliveries for other rounds are
    dropped. Model states are kept one per sender, its newest (a donor sends one per ask), and for
    at most ``max(states_kept, members())`` senders, the oldest dropped (the optimizer keeps one per
    rank of the job: the root of a final average receives one from every rank, also from those
    that left the job once they sent it, and from some before it finished training). So what a
    peer can make this one hold is bounded by the window and the membership, not by what it sends.
    A delivery whose content the channel cannot decode is dropped too. ``drops`` counts each drop
    by reason; ``dropped`` is their total.
    """

    def __init__(self, channel: DeliverySource, wanted: Callable[[], tuple[int, int]],
                 members: Callable[[], int] = lambda: 0) -> None:
        self._channel = channel
        self._wanted = wanted
        self._members = members
        self._rounds: dict[int, dict[int, Delivery]] = defaultdict(dict)
        self._states: dict[int, Delivery] = {}  # by sender, in arrival order
        self.newest: dict[int, int] = {}  # sender -> its newest round message id, least recently heard first
        self.drops: Counter[str] = Counter()
        self.states_kept = MAX_STATES  # senders whose state is kept at least

    @property
    def dropped(self) -> int:
        """Deliveries dropped, all reasons together."""
        return sum(self.drops.values())

    def pump(self, timeout: float) -> bool:
        """Receive at most one delivery (waiting up to `timeout` s); True if one came."""
        try:
            d = self._channel.recv(timeout=max(0.0, timeout))
        except UNUSABLE as exc:
            self.drops[f"undecodable ({type(exc).__name__})"] += 1
            return True
        if d is None:
            return False
        if d.msg_id & STATE_FLAG:
            if self._states.pop(d.sender, None) is not None:
                self.drops["superseded state"] += 1  # by the sender's newer one
            self._states[d.sender] = d
            while len(self._states) > max(self.states_kept, self._members()):
                del self._states[next(iter(self._states))]
                self.drops["states over the limit"] += 1
            return True
        self._heard(d.sender, d.msg_id)
        first, last = self._wanted()
        if first <= d.msg_id <= last:
            self._rounds[d.msg_id][d.sender] = d
        else:
            self.drops["round outside the window"] += 1
        return True

    def _heard(self, sender: int, msg_id: int) -> None:
        new = sender not in self.newest
        self.newest[sender] = max(msg_id, self.newest.pop(sender, msg_id))
        while new and len(self.newest) > max(MAX_STATES, self._members()):  # (a new sender is rare)
            del self.newest[next(iter(self.newest))]

    def drain(self) -> None:
        while self.pump(0.0):
            pass

    def wait_round(self, rnd: int, senders: set[int], until: float, alive: Callable[[int], bool],
                   moved_on: int | None = None) -> None:
        """Wait until every live sender of message `rnd` delivered it or one of id `moved_on`
        (default rnd + 1: its next round) or later, or until the monotonic `until`."""
        moved_on = rnd + 1 if moved_on is None else moved_on
        while True:
            got = self._rounds.get(rnd, {})
            if all(s in got or not alive(s) or self.newest.get(s, -1) >= moved_on for s in senders):
                return
            left = until - time.monotonic()
            if left <= 0:
                return
            self.pump(min(left, 0.05))

    def pending(self) -> int:
        """Round messages kept and not taken yet (the backlog a later merge has to work through)."""
        return sum(len(got) for got in self._rounds.values())

    def take(self, first: int, last: int) -> list[Delivery]:
        """Remove and return the deliveries of rounds first..last (by round, then sender); drop anything older."""
        out = []
        for rnd in sorted(self._rounds):
            if rnd <= last:
                got = self._rounds.pop(rnd)
                if rnd >= first:  # by sender: the merge's sums do not depend on arrival order
                    out.extend(got[sender] for sender in sorted(got))
        return out

    def take_state(self, sender: int | None, until: float) -> Delivery | None:
        """Wait for a model state (from `sender`, or anyone) until the monotonic `until`."""
        while True:
            if self._states and (sender is None or sender in self._states):
                return self._states.pop(next(iter(self._states)) if sender is None else sender)
            left = until - time.monotonic()
            if left <= 0:
                return None
            self.pump(min(left, 0.05))
