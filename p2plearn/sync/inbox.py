"""Deliveries from the engine, kept by (message id, sender) until a round's merge or a collective takes them.

The one inbox of the project: training's synchronizers file rounds and model states in it, the
DDP backend's collectives (`p2plearn.distributed.collectives`) their phases. What differs between
them is the caller's: its window of ids (`wanted`, wrapping around or not), the quotas of its
`KeptMessages`, which deliveries it admits at all (``admit``) and which one a waiting collective
claims before anything is filed (``pump(claim=)``).
"""
from __future__ import annotations

import struct
import time
from collections import Counter
from collections.abc import Iterator
from typing import Callable

from p2plearn.protocols import DeliverySource
from p2plearn.sync.kept import KeptMessages
from p2plearn.transport import Delivery

STATE_FLAG = 1 << 31  # message ids with this bit carry a whole model state (join, final average), not a round
# (0xFFFFFF00-0xFFFFFFFE, state ids of clocks no job reaches, are the Channel's multicast probes')
POLL_S = 0.05         # a wait's longest poll of the channel (its checks of liveness and time run between)
MAX_STATES = 4        # model states kept unasked for, at least: one per sender (a donor's newest, a final model)
# What a channel raises about one delivery's content (a descriptor it cannot map, a size that does
# not fit: a peer's bug or a hostile key holder): that delivery is lost, the next ones are not. A
# closed or failed channel raises otherwise (TransportError, an OSError) and ends the round.
UNUSABLE = (ValueError, TypeError, IndexError, KeyError, OverflowError, struct.error)

Admit = Callable[[Delivery], str | None]  # why a delivery is not for this inbox's owner at all, else None
Claim = Callable[[Delivery], bool]  # whether a waiting caller took the delivery (it is then not filed)
Warn = Callable[[str, int], None]  # told once per (reason, sender) of a drop


class Inbox:
    """Pulls deliveries off a channel and files them; messages may arrive early (faster peers).

    ``wanted()`` gives the message ids (first, last) worth keeping now, ``ids`` the modulus they
    wrap around at (None: they do not). A delivery for an id in the window is kept in ``kept``
    (its quotas per (id, sender) and per sender); one for an id before the window is counted in
    ``late`` (a slow peer's, or the end of a lossy phase); one beyond it is dropped as ``beyond``.
    Messages with ``state_flag`` in their id (0: none) are model states, kept one per sender,
    its newest (a donor sends one per ask), and for at most ``max(states_kept, members())``
    senders, the oldest dropped (the optimizer keeps one per rank of the job: the root of a final
    average receives one from every rank, also from those that left the job once they sent it,
    and from some before it finished training). So what a peer can make this one hold is bounded
    by the window, the quotas and the membership, not by what it sends. A delivery whose content
    the channel cannot decode is dropped too.

    ``drops`` counts each drop by reason (``refused``: the same counter, the DDP backend's name
    for it), ``warn`` hears of the first of each reason and sender; ``dropped`` is every delivery
    not kept, late ones included. Not thread-safe: one thread (its owner's) pumps and takes.
    """

    def __init__(self, channel: DeliverySource, wanted: Callable[[], tuple[int, int]],
                 members: Callable[[], int] = lambda: 0, *, kept: KeptMessages | None = None,
                 ids: int | None = None, state_flag: int = STATE_FLAG, admit: Admit | None = None,
                 beyond: str = "round outside the window", warn: Warn | None = None) -> None:
        self._channel = channel
        self._wanted = wanted
        self._members = members
        self._kept = KeptMessages() if kept is None else kept
        self._ids = ids
        self._state_flag = state_flag
        self._admit = admit
        self._beyond = beyond
        self._warn = warn
        self._warned: set[tuple[str, int]] = set()
        self._states: dict[int, Delivery] = {}  # by sender, in arrival order
        self.newest: dict[int, int] = {}  # sender -> its newest round message id, least recently heard first
        self.drops: Counter[str] = Counter()
        self.late = 0  # messages for ids before the window: their round or collective was over
        self.states_kept = MAX_STATES  # senders whose state is kept at least

    @property
    def refused(self) -> Counter[str]:
        """The drops by reason (what the DDP backend's stats() calls refused)."""
        return self.drops

    @property
    def dropped(self) -> int:
        """Deliveries not kept, all reasons together, late ones included."""
        return sum(self.drops.values()) + self.late

    def drop(self, reason: str, sender: int) -> None:
        """Count a delivery dropped (sender -1: unknown); ``warn`` hears of each reason and sender once."""
        self.drops[reason] += 1
        if self._warn is not None and (reason, sender) not in self._warned:
            self._warned.add((reason, sender))
            self._warn(reason, sender)

    def pump(self, timeout: float, claim: Claim | None = None) -> bool:
        """Receive at most one delivery (waiting up to `timeout` s) and file it, unless `claim`
        takes it first; True if one came."""
        try:
            d = self._channel.recv(timeout=max(0.0, timeout))
        except UNUSABLE as exc:
            self.drop(f"undecodable ({type(exc).__name__})", -1)
            return True
        if d is None:
            return False
        if self._admit is not None and (reason := self._admit(d)) is not None:
            self.drop(reason, d.sender)
        elif claim is not None and claim(d):
            pass
        elif d.msg_id & self._state_flag:
            self._keep_state(d)
        else:
            self._file(d)
        return True

    def _keep_state(self, d: Delivery) -> None:
        if self._states.pop(d.sender, None) is not None:
            self.drop("superseded state", d.sender)  # by the sender's newer one
        self._states[d.sender] = d
        while len(self._states) > max(self.states_kept, self._members()):
            oldest = next(iter(self._states))
            del self._states[oldest]
            self.drop("states over the limit", oldest)

    def _file(self, d: Delivery) -> None:
        if self._ids is None:  # (ids that wrap around have no newest: the collectives wait by id only)
            self._heard(d.sender, d.msg_id)
        first, last = self._wanted()
        where = self._where(d.msg_id, first, last)
        if where < 0:
            self.late += 1
        elif where > 0:
            self.drop(self._beyond, d.sender)
        elif (reason := self._kept.add(d)) is not None:
            self.drop(reason, d.sender)

    def _where(self, msg_id: int, first: int, last: int) -> int:
        """-1 if ``msg_id`` comes before ids first..last, 0 if among them, 1 if after them."""
        if self._ids is None:
            return -1 if msg_id < first else 0 if msg_id <= last else 1
        if (msg_id - first) % self._ids <= last - first:
            return 0
        return -1 if (first - msg_id) % self._ids < self._ids // 2 else 1  # the nearer way round

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
        while not self._waited(rnd, senders, alive, moved_on, set()):
            left = until - time.monotonic()
            if left <= 0:
                return
            self.pump(min(left, POLL_S))

    def arrivals(self, rnd: int, senders: set[int], until: float, alive: Callable[[int], bool],
                 moved_on: int | None = None) -> Iterator[Delivery | None]:
        """`wait_round`'s wait, yielding message `rnd`'s deliveries (taken, by sender) as they are
        filed, and None after each poll that brought nothing (the wait is idle: time for a merge to
        fold what came)."""
        came: set[int] = set()
        while True:
            for d in self.take(rnd, rnd):
                came.add(d.sender)
                yield d
            if self._waited(rnd, senders, alive, moved_on, came) or until - time.monotonic() <= 0:
                return
            if not self.pump(min(until - time.monotonic(), POLL_S)):
                yield None

    def _waited(self, rnd: int, senders: set[int], alive: Callable[[int], bool], moved_on: int | None,
                came: set[int]) -> bool:
        """Whether each of `senders` delivered message `rnd` (it is kept, or in `came`), is dead, or
        sent one of id `moved_on` (default rnd + 1) or later."""
        moved_on = rnd + 1 if moved_on is None else moved_on
        return all(s in came or self._kept.holds(rnd, s) or not alive(s) or self.newest.get(s, -1) >= moved_on
                   for s in senders)

    def pending(self) -> int:
        """Messages kept and not taken yet (the backlog a later merge has to work through)."""
        return len(self._kept)

    def take(self, first: int, last: int) -> list[Delivery]:
        """Remove and return the deliveries of ids first..last (by id from first, then sender,
        then arrival); drop those before first (counted late)."""
        out = []
        for msg_id in sorted(self._kept.ids(), key=lambda i: i - first if self._ids is None else (i - first) % self._ids):
            where = self._where(msg_id, first, last)
            if where > 0:
                continue
            got = self._kept.pop(msg_id)
            if where < 0:
                self.late += sum(len(kept) for kept in got.values())
            else:  # by sender: the merge's sums do not depend on arrival order
                out.extend(d for sender in sorted(got) for d in got[sender])
        return out

    def take_state(self, sender: int | None, until: float) -> Delivery | None:
        """Wait for a model state (from `sender`, or anyone) until the monotonic `until`."""
        while True:
            if self._states and (sender is None or sender in self._states):
                return self._states.pop(next(iter(self._states)) if sender is None else sender)
            left = until - time.monotonic()
            if left <= 0:
                return None
            self.pump(min(left, POLL_S))
