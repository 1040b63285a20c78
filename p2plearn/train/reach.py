"""`MulticastReach`: which peers this engine's multicast group reaches (``--transport-mode auto``),
kept up to date while peers join, restart or move their engines.

The coordinator labels multicast domains from every peer's report (``Client.report_reach``): two
peers share one only if each one's probe reached the other. A probe made once at start-up misses
every engine registered later, so a peer that joins or restarts would stay unicast-only for the
rest of the job. Here each peer probes every new engine it hears of (a member's ``join`` or
``update`` event) in a thread of its own, so training never waits for it, and reports its whole
reach again; the coordinator has forgotten the old engine's reach meanwhile (``_forget_reach``).

Tuning: ``timeout`` is how long a probe waits for a receiver's answer (a probe is two small
messages; one not answered in time counts as not reached, until that peer's engine changes).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping

from p2plearn.control import ControlError
from p2plearn.control.membership import Event
from p2plearn.protocols import ControlClient
from p2plearn.transport import Channel

log = logging.getLogger("p2plearn")


class MulticastReach:
    """The ranks this peer's multicast group reaches, probed and reported to the coordinator.

    ``probe(members)`` probes the engines known at start-up and reports (blocking: the first round
    plans by it); ``on_event`` (a ``Client.on_event`` callback) queues engines that appear later
    for the background thread. ``close()`` stops that thread.
    """

    def __init__(self, channel: Channel, client: ControlClient, rank: int, timeout: float = 2.0) -> None:
        self.channel = channel
        self.client = client
        self.rank = rank
        self.timeout = timeout
        self._reached: set[int] = set()                      # ranks reported reached; guarded by _cond
        self._probed: dict[int, tuple[str, int]] = {}        # rank -> the engine last probed; guarded by _cond
        self._pending: dict[int, tuple[str, int]] = {}       # engines heard of, not probed yet; guarded by _cond
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def probe(self, members: Mapping[int, tuple[str, int] | None]) -> None:
        """Probe ``members``' engines now, report the reach, then follow later engines in the background."""
        self._probe({r: e for r, e in members.items() if r != self.rank and e})
        self._thread = threading.Thread(target=self._run, name="p2plearn-multicast-reach", daemon=True)
        self._thread.start()

    def on_event(self, event: Event) -> None:
        if event.rank is None or event.rank == self.rank:
            return
        with self._cond:
            if event.kind in ("join", "update") and event.engine:
                engine = (str(event.engine[0]), int(event.engine[1]))
                if self._probed.get(event.rank) != engine:
                    self._pending[event.rank] = engine
                    self._cond.notify_all()
            elif event.kind in ("leave", "dead"):
                self._pending.pop(event.rank, None)
                self._probed.pop(event.rank, None)
                self._reached.discard(event.rank)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.timeout + 1.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._pending)
                if self._closed:
                    return
                engines, self._pending = self._pending, {}
            self._probe(engines)

    def _probe(self, engines: dict[int, tuple[str, int]]) -> None:
        reached_engines = self.channel.probe_multicast(engines.values(), timeout=self.timeout) if engines else set()
        members = self.client.members
        with self._cond:
            for rank, engine in engines.items():
                if rank not in members:  # left or died while probed: its next engine is probed afresh
                    continue
                self._probed[rank] = engine
                if self._pending.get(rank) == engine:  # announced while this probe ran: done
                    del self._pending[rank]
                if engine in reached_engines:
                    self._reached.add(rank)
                else:
                    self._reached.discard(rank)
            reached = sorted(self._reached)
        self._report(reached)

    def _report(self, reached: Iterable[int]) -> None:
        try:
            self.client.report_reach(reached)
        except ControlError as exc:  # e.g. a rank that died meanwhile: the next probe reports again
            log.warning("p2plearn rank %d: multicast reach not reported, unicast only: %s", self.rank, exc)
