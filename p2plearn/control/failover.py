"""Finding the coordinator again when it falls silent.

The candidates, in order: where the coordinator said it moved, the old endpoint (it may only have
been slow), then each live member's standby endpoint in rank order. The live member of lowest rank
is the successor: when its own turn comes it starts a coordinator process at its standby endpoint
(the next term, handed the old one's address), and every client re-registers there. A client that
finds none for ``give_up`` seconds gives up (``CoordinatorDead``); one that left, whose job ended,
or that is closed, stops looking.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from .lifecycle import Lifecycle, Phase
from .membership import Event
from .replica import MembershipReplica
from .requester import Requester

OLD_COORDINATOR_S = 1.0  # how long a suspected coordinator is asked again before looking for a successor
# A successor this peer starts exits once no peer has been registered there for SUCCESSOR_LINGER_S
# (the job ended), or if none registers within SUCCESSOR_GRACE_S (this peer re-registers at once).
SUCCESSOR_LINGER_S = 1.0
SUCCESSOR_GRACE_S = 10.0


class Failover:
    """The search for a coordinator, and the successor this peer may host.

    - ``successor_wait``: seconds to wait for one successor candidate before trying the next; it
      must cover a candidate noticing the death and starting a process (a few seconds).
    - ``give_up``: seconds without any coordinator after which the client is dead.
    - ``standby``: where this peer would host a successor (None: chosen on first use, next to the
      coordinator's address; see ``standby_endpoint``).
    - ``successor``: how a successor is started, bar its endpoint, term and predecessor: the job id,
      secret, world size, heartbeat and detector settings of the coordinator it replaces.
    - ``emit``: where its events go (``coordinator_dead``, ``successor_failed``).
    """

    def __init__(self, requester: Requester, lifecycle: Lifecycle, replica: MembershipReplica, *,
                 session: str, successor_wait: float, give_up: float, standby: str | None,
                 successor: dict[str, Any], emit: Callable[[Event], None]) -> None:
        self.successor_wait = successor_wait
        self.give_up = give_up
        self.moved_to: str | None = None  # where the coordinator said it moved: set by the background
                                          # thread (MOVED), taken by find() on the same thread
        self.spawned: Any = None          # the coordinator process this peer started as a successor
        self._requester = requester
        self._life = lifecycle
        self._replica = replica
        self._session = session
        self._standby = standby
        self._successor = successor
        self._emit = emit

    @property
    def standby(self) -> str:
        """Where this peer hosts the coordinator should it become the successor."""
        if self._standby is None:
            self._standby = standby_endpoint(self._requester.endpoint, self._session)
        return self._standby

    def find(self, term: int, rank: int | None, receive_pending: Callable[[], None]) -> tuple[str, dict, bool] | None:
        """Look for the coordinator of ``term`` (the same one if it was only slow, else the
        successor); (its endpoint, its hello, whether this client must hand over its state there),
        with the client left seeking until it follows it. None, with the client no longer seeking,
        once ``give_up`` seconds passed without one, or once it no longer takes part in the job:
        ``receive_pending`` applies what the old coordinator's stream still holds, which may say
        that the job ended."""
        if not self._life.seek():
            return None
        old, moved = self._requester.endpoint, self.moved_to
        self.moved_to = None
        started = time.monotonic()
        while self._life.phase.in_job:
            for endpoint, wait in self._candidates(old, moved, term, rank):
                hello = self._requester.probe(endpoint, wait)
                newer = hello is not None and hello["term"] > term
                if hello is not None and (endpoint == old or newer):
                    # A later term at the old endpoint is a successor that took it over: hand over too.
                    return endpoint, hello, endpoint != old or newer
                if time.monotonic() - started > self.give_up:
                    break
                # A peer stopped (SIGSTOP) past the end of its job takes the silence for a death
                # before its ENDED is read; it must not start a successor and train alone.
                receive_pending()
                if not self._life.phase.in_job:
                    return None
            moved = None
            if time.monotonic() - started > self.give_up:
                if self._life.move(Phase.DEAD):
                    self._emit(Event("coordinator_dead"))
                return None
        return None

    def _candidates(self, old: str, moved: str | None, term: int, rank: int | None) -> Iterator[tuple[str, float]]:
        """(endpoint, seconds to wait for it): where the coordinator was said to move, the old one
        (it may only have been slow), then each live member's standby in rank order; this peer
        starts the successor itself when its turn comes."""
        if moved:
            yield moved, self.successor_wait
        yield old, OLD_COORDINATOR_S
        for member in sorted(self._replica.members.values(), key=lambda m: m.rank):
            if member.rank == rank and self._life.phase.member:
                if self._start_successor(old, term, rank):
                    yield self.standby, self.successor_wait
            elif member.standby:
                yield member.standby, self.successor_wait

    def _start_successor(self, old: str, term: int, rank: int | None) -> bool:
        from .server import spawn  # a process only the successor starts

        if self.spawned is not None and self.spawned.alive():
            return True
        try:
            self.spawned = spawn(bind=self.standby, term=term + 1, previous=old, linger=SUCCESSOR_LINGER_S,
                                 startup_timeout=SUCCESSOR_GRACE_S, **self._successor)
        except RuntimeError as exc:  # e.g. the standby port was taken since: the next candidate serves
            self._emit(Event("successor_failed", rank=rank, endpoint=str(exc)))
            return False
        return True


def standby_endpoint(coordinator: str, session: str) -> str:
    """Where this peer would serve as the successor: next to an ipc coordinator (namespaces share
    the file system), else a free port on the address this host reaches the coordinator from."""
    if coordinator.startswith("ipc://"):
        directory = os.path.dirname(coordinator[len("ipc://"):]) or tempfile.gettempdir()
        return f"ipc://{os.path.join(directory, 'standby-' + session[:12])}"
    host = coordinator[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))
            local = probe.getsockname()[0]
        except OSError:
            local = "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as free:
        free.bind((local, 0))
        port = free.getsockname()[1]
    return f"tcp://{local}:{port}"
