"""The control-plane client that lives in every peer (and in the launcher, as an observer).

``Client`` composes the parts, one concern each:

- ``Requester`` (requester.py): requests and their replies, one-way reports;
- ``MembershipReplica`` (replica.py): the membership, slowest clock, views and progress pushed here;
- ``Listener`` (listener.py): the background thread: heartbeats, pushed events, the coordinator watched;
- ``Failover`` (failover.py): finding the coordinator again, starting the successor;
- ``Lifecycle`` (lifecycle.py): the one phase the client is in, shared by the two threads.

Nothing on a training step waits for an answer: the synchronizer plans from the views pushed here
(``view_for``), reads the membership pushed here, and reports one-way. When the coordinator
falls silent the background thread finds its successor: the live member of lowest rank hosts a
new coordinator process at the ``standby`` endpoint it registered, every client re-registers
there (the first one hands over the membership and the view it held), and training goes on with
the last view meanwhile. Only when no coordinator can be reached for ``give_up`` seconds does the
client give up (``CoordinatorDead``).

The end of a job is no fault: a coordinator stopped at the end of its job says so (``ENDED``), and
a client told so, or one that left or is closing, never looks for a successor.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import zmq

from ..keys import control_key
from ..transport.nic import link_rate
from . import protocol as p
from .progress import Progress
from .errors import ControlError, CoordinatorDead, Refused, SelfConnected
from .failover import Failover
from .lifecycle import Lifecycle, Phase
from .listener import Listener, reachable
from .membership import Event, Member
from .replica import MembershipReplica, snapshot
from .requester import Requester, checked
from .view import GlobalView

__all__ = ["Client", "ControlError", "CoordinatorDead", "Refused", "SelfConnected"]

log = logging.getLogger("p2plearn.control")
MEMBER_EVENTS = ("join", "update", "leave", "dead")


class Client:
    """Connect a peer to the coordinator at ``address`` (``host:port``, ``tcp://...`` or ``ipc://...``).

    - ``job_id`` / ``key``: from ``P2PLEARN_JOB_ID`` / ``P2PLEARN_JOB_KEY``; a mismatch is refused.
    - ``rank``: this peer's rank; None for a joining peer that lets the coordinator choose, or for
      an observer that never registers (the launcher).
    - ``timeout``: seconds any single request may take before ControlError; raise it only on
      a very slow network (requests are small).
    - ``connect_timeout``: how long to keep trying to reach a coordinator that is still starting.
    - ``host``: the host name reported to others (default: this machine's name).
    - ``standby``: where this peer would host a successor coordinator (default: a free port on the
      address it reaches the coordinator from, or a unix socket next to an ``ipc://`` coordinator).
    - ``successor_wait``: seconds to wait for one successor candidate before trying the next;
      it must cover a candidate noticing the death and starting a process (a few seconds).
    - ``give_up``: seconds without any coordinator after which every call raises CoordinatorDead.
    The heartbeat period and the detector's threshold are the coordinator's settings.
    """

    def __init__(self, address: str, job_id: str, key: str | bytes, *, rank: int | None = None,
                 timeout: float = 5.0, connect_timeout: float = 30.0, host: str | None = None,
                 standby: str | None = None, successor_wait: float = 5.0, give_up: float = 60.0) -> None:
        self.job_id = job_id
        # Thread notes: the caller's thread makes requests and reports; the background thread
        # (Listener) applies pushed events and runs the failover, which re-registers (rank, donor,
        # start_clock) and counts (failovers, coordinator_changes). Shared state is in the parts,
        # under their locks; the fields here are single references, each written by one side at a time.
        self.rank = rank          # set by a registration (a joiner learns it there)
        self.timeout = timeout
        self.host = host or socket.gethostname()
        self.successor_wait = successor_wait
        self.give_up = give_up
        self.events: queue.Queue[Event] = queue.Queue()
        self.donor: Member | None = None
        self.start_clock = 0
        self.dropped_reports = 0  # reports sent while no coordinator was reachable (lost, harmlessly)
        self.coordinator_changes = 0
        self.failovers = 0  # times this client looked for its coordinator again (it may find the same one)
        self._session = uuid.uuid4().hex
        self._key = control_key(key)
        self._engine: tuple[str, int] | None = None
        self._clock = 0           # the last clock this peer reported
        self._rejoined_from_beat = 0  # expelled answers to heartbeats sent before a rejoin are stale
        self._callbacks: list[Callable[[Event], None]] = []
        self._cond = threading.Condition()  # guards the life cycle and the replica: waits wake on either
        self._life = Lifecycle(self._cond, job_id, give_up)
        self._replica = MembershipReplica(self._cond, self._life, self._check)
        ctx = zmq.Context.instance()
        self._requester = Requester(ctx, p.endpoint(address), self._key, job_id, self._session, timeout, self._check)
        try:
            hello = self._requester.hello(connect_timeout)
        except BaseException:
            self._requester.close()
            raise
        self.heartbeat = hello["heartbeat"]
        self.world_size = hello["world_size"]
        # The coordinator's term (a successor's is higher) and where it publishes: written by the
        # background thread only, when it follows another coordinator.
        self._term = hello["term"]
        self._pub_endpoint = reachable(hello["pub"], self._requester.endpoint)
        settings = {k: hello[k] for k in ("phi_threshold", "startup_grace")}
        self._failover = Failover(self._requester, self._life, self._replica, session=self._session,
                                  successor_wait=successor_wait, give_up=give_up, standby=standby, emit=self._emit,
                                  successor={"job_id": job_id, "key": key, "world_size": self.world_size,
                                             "heartbeat": self.heartbeat, **settings})
        self._listener = Listener(ctx, key, self._key, job_id, self._session, self._life,
                                  heartbeat=self.heartbeat, phi_threshold=settings["phi_threshold"],
                                  rank=lambda: self.rank, coordinator=self._following,
                                  dispatch=self._on_message, failover_due=lambda: self._failover.moved_to is not None,
                                  failover=self._find_coordinator)
        self._listener.start()
        self._listener.subscribed.wait(timeout)

    def _check(self) -> None:
        self._life.check(self._requester.endpoint)

    def _following(self) -> tuple[str, str, int]:
        return self._requester.endpoint, self._pub_endpoint, self._term

    # -- public API ------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """The endpoint of the coordinator this client follows now."""
        return self._requester.endpoint

    @property
    def standby(self) -> str:
        """Where this peer hosts the coordinator should it become the successor."""
        return self._failover.standby

    @property
    def rejected(self) -> Counter[str]:
        """Malformed messages from a key holder, by type, dropped."""
        return self._listener.rejected

    def register(self, engine: tuple[str, int] | None = None, *, join: bool = False) -> dict[int, Member]:
        """Join the membership with this peer's data-engine address; returns the members.

        Calling it again updates the engine address. With ``join=True`` the peer joins a
        running job: ``self.donor`` is the live peer that will send it the model state (None if
        it is alone) and ``self.start_clock`` the clock it takes part from.
        """
        self._engine = engine or self._engine
        reply, blobs = self._requester.request(self._register_body(join))
        with checked("registration"):
            self._apply_registration(reply, blobs, admitted=join or not self._life.phase.member)
        self._life.admit()
        return self.members

    def _register_body(self, join: bool, resume: dict | None = None) -> dict[str, Any]:
        body = {"type": p.REGISTER, "rank": self.rank, "host": self.host,
                "engine": list(self._engine) if self._engine else None, "standby": self.standby, "join": join,
                "clock": self._clock, "link_rate": link_rate(self._engine[0]) if self._engine else None}
        return {**body, "resume": resume} if resume else body

    def _apply_registration(self, reply: dict, blobs: list[bytes], admitted: bool) -> None:
        """``admitted``: this registration made the peer a member (not an update of its address).
        Checked whole before any of it is applied (``protocol.BadField``)."""
        rank, clock = p.integer(reply.get("rank"), "rank", 0, p.MAX_RANK), p.integer(reply.get("clock"), "clock")
        donor = Member.from_dict(reply["donor"]) if reply.get("donor") else None
        members, view = snapshot(reply), GlobalView.from_blobs(reply.get("view"), blobs)
        self.rank = rank
        if admitted:
            self.start_clock, self.donor = clock, donor
        self._replica.apply_snapshot(*members)
        self._replica.add_view(view)

    def ask_for_state(self) -> Member | None:
        """Ask the coordinator for a donor again (the state from the last one did not come);
        returns the new donor (None: no live peer holds a state)."""
        reply, _ = self._requester.request({"type": p.STATE, "rank": self.rank})
        with checked("donor"):
            self.donor = Member.from_dict(reply["donor"]) if reply.get("donor") else None
        return self.donor

    def report(self, clock: int, *, loss: float | None = None, step_time: float | None = None,
               links: Mapping[int, Mapping[str, float]] | None = None, load: Mapping[str, float] | None = None,
               message_bytes: int | None = None, counts: Mapping[str, int] | None = None) -> None:
        """Report a finished round (one-way, never waits; dropped while no coordinator is reachable).

        ``clock``: rounds this peer has completed; ``loss``: training loss (for the progress
        line); ``step_time``: seconds of the round; ``links[receiver]``: what the engine measured
        towards it: ``paced`` (the pacing rate, bytes/s; 0 = unpaced), ``rate`` (the ACK-based
        delivery rate, bytes/s; 0 = too short to time), ``probe`` (the end(s) the flow probed),
        ``multicast`` (it went through this peer's group: one copy for all such) (see ``estimator``);
        ``load``: this peer's ``compute_s``, ``merge_s``, ``backlog``, ``in_flight_bytes`` and
        ``in_flight_msgs`` (see ``GlobalView``); ``message_bytes``: the size of this peer's
        message (the plans weigh it); ``counts``: this peer's counters over the job, for the
        coordinator's /metrics (deadline hits, slow closes, the engine's drops by reason).
        """
        if self._life.phase is Phase.ENDED:
            self.dropped_reports += 1  # nobody collects reports once the job's coordinator stopped
            return
        self._check()
        self._clock = max(self._clock, int(clock))
        body = {"type": p.REPORT, "rank": self.rank, "session": self._session, "clock": int(clock),
                "loss": loss, "step_time": step_time, "message_bytes": message_bytes, "load": dict(load or {}),
                "links": {str(j): dict(s) for j, s in (links or {}).items()}, "counts": dict(counts or {})}
        if self._life.phase.seeking or not self._requester.post(body):
            self.dropped_reports += 1  # not reachable now, or not reading: the detector will tell

    def report_reach(self, reached: Iterable[int]) -> None:
        """Tell the coordinator which ranks this peer's multicast probe reached
        (``Channel.probe_multicast``); the view's ``mcast_domain`` follows from every peer's report.
        Raises ControlError if the coordinator refuses it."""
        self._requester.request({"type": p.REACH, "rank": self.rank, "reached": sorted(int(j) for j in reached)})

    def leave(self, timeout: float | None = None) -> None:
        """Deregister cleanly; the others are told at once. From now on this client starts no
        successor, should the coordinator go quiet (it stops at the end of the job). ``timeout``:
        how long to wait for the coordinator's reply (default: the client's)."""
        if self._life.leave():
            self._requester.request({"type": p.LEAVE, "rank": self.rank}, timeout)

    def fetch_view(self, timeout: float | None = None) -> GlobalView:
        """Ask for the current GlobalView (``view`` holds the newest one pushed)."""
        reply, blobs = self._requester.request({"type": p.VIEW}, timeout)
        with checked("view"):
            view = GlobalView.from_blobs(reply.get("view"), blobs)
        self._replica.add_view(view)
        return view

    @property
    def view(self) -> GlobalView | None:
        """The newest GlobalView held (None before the first)."""
        return self._replica.view

    def view_for(self, round: int) -> GlobalView | None:
        """The view that plans ``round``: the newest whose ``from_round`` is at most ``round``
        (every peer holding the same views picks the same one)."""
        return self._replica.view_for(round)

    @property
    def members(self) -> dict[int, Member]:
        """The live members by rank, as last pushed."""
        return self._replica.members

    @property
    def min_clock(self) -> int:
        """The slowest live peer's clock, as last pushed."""
        return self._replica.min_clock

    @property
    def progress(self) -> Progress | None:
        """The job's progress, as the coordinator's last tick said (None before the first)."""
        return self._replica.progress

    @property
    def phase(self) -> Phase:
        """Where this client is in its life cycle (``lifecycle.Phase``)."""
        return self._life.phase

    @property
    def following(self) -> bool:
        """False while the client is looking for a (new) coordinator, and once the job ended."""
        return self._life.phase.following

    @property
    def ended(self) -> bool:
        """Whether the coordinator said the job ended (it stopped; no successor follows)."""
        return self._life.phase is Phase.ENDED

    @property
    def clock_current(self) -> bool:
        """Whether ``min_clock`` is the coordinator's current one: it ticks every heartbeat, and one
        came within the pause its detector forgives (a busy host delays ticks). A hung coordinator
        is known (``following``) only seconds later; a wait on the clock should not outlast that."""
        detector = self._listener.detector
        return self.following and time.monotonic() - detector.last < detector.acceptable_pause

    def wait_min_clock(self, target: int, timeout: float) -> bool:
        """Wait until the slowest live clock reaches ``target``; False on timeout (SSP decides
        what to do then), CoordinatorDead once the client gave up on every coordinator."""
        return self._replica.wait_min_clock(target, timeout)

    def wait_members(self, count: int, timeout: float, *, receiving: bool = False) -> dict[int, Member]:
        """Wait until ``count`` peers are, or once were, live members at the same time; with
        ``receiving``, also until a view planned them all as receivers (their engines are known),
        so that every peer plans its first round from the same view. "Once were" counts since this
        client followed its coordinator: peers that finished and left meanwhile do not undo the
        start, nor does the end of the job (the others trained and left). Returns the members now.
        ControlError on timeout, or when the job ended before it started."""
        return self._replica.wait_members(count, timeout, receiving, self.rank)

    def wait_alone(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s until no other peer is a member (each left or was declared
        dead), or the job ended; True if so. The peer that started the coordinator calls it after
        ``leave()`` and before stopping the coordinator (a peer finishing a moment later still finds
        it), and before ``close()``: a closed client's membership is no longer kept up to date."""
        return self._replica.wait_alone(self.rank, timeout)

    def wait_left(self, ranks: Iterable[int], timeout: float) -> bool:
        """Wait up to ``timeout`` s until none of ``ranks`` is a member (each left or was declared
        dead), or the job ended; True if so."""
        return self._replica.wait_left(ranks, timeout)

    def on_event(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback(event)`` on the client's thread for each event; keep it short (hand
        long work, like sending state to a joiner, to another thread or poll ``events``)."""
        self._callbacks.append(callback)

    def close(self) -> None:
        """Stop heartbeats and release the sockets (does not deregister: see ``leave``).

        A coordinator this peer started as a successor keeps serving the others; it ends by itself
        once the job has no member. A client whose job ended, or that gave up, keeps saying so."""
        seeking = self._life.phase.seeking  # a failover may be in a request: give it that long
        self._life.move(Phase.CLOSED)
        self._listener.join(timeout=2.0 + (self.timeout if seeking else 0.0))
        self._requester.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self.leave()
        finally:
            self.close()

    # -- pushed events (on the background thread) ---------------------------------------------------

    def _on_message(self, kind: str, body: dict, blobs: list[bytes]) -> None:
        """Apply one pushed event or late reply; every field is checked first (``protocol.BadField``)."""
        if kind == p.TICK:
            epoch, min_clock = p.integer(body.get("epoch"), "epoch"), p.integer(body.get("min_clock"), "min_clock")
            progress = Progress.from_dict(body["progress"]) if body.get("progress") else None
            self._listener.heard()
            if self._replica.tick(epoch, min_clock, progress):  # a membership event was missed: resync
                self._listener.ask_for_members()
        elif kind == p.OK and "members" in body:
            self._replica.apply_snapshot(*snapshot(body))
        elif kind == p.ERROR and body.get("expelled") is True and self._life.phase.member:
            if p.integer(body.get("id") or 0, "id") >= self._rejoined_from_beat:
                self._rejoin()
        elif kind == p.MEMBER:
            self._on_member(body)
        elif kind == p.CLOCK:
            self._replica.set_min_clock(p.integer(body.get("min_clock"), "min_clock"))
        elif kind == p.VIEW:
            self._replica.add_view(GlobalView.from_blobs(body.get("view"), blobs))
        elif kind == p.DONATE:
            to, rank = (p.integer(body.get(name), name, 0, p.MAX_RANK) for name in ("to", "rank"))
            engine, clock = p.engine_address(body.get("engine")), p.integer(body.get("clock"), "clock")
            if to == self.rank:
                self._emit(Event("donate", rank=rank, engine=engine, clock=clock))
        elif kind == p.MOVED:
            term, endpoint = p.integer(body.get("term"), "term"), p.valid_endpoint(body.get("endpoint"), "endpoint")
            if term > self._term:
                self._failover.moved_to = endpoint
        elif kind == p.ENDED and p.integer(body.get("term"), "term") >= self._term:
            members, planned = (p.integer(body.get(name, 0), name, 0, p.MAX_RANK + 1)
                                for name in ("most_members", "most_planned"))
            with self._cond:  # a start-up wait woken by the end sees how many the job had
                self._replica.peaked(members, planned)
                ended = self._life.move(Phase.ENDED)
            if ended:
                self._emit(Event("job_ended"))

    def _on_member(self, body: dict) -> None:
        member, event = Member.from_dict(body.get("member")), body.get("event")
        epoch = p.integer(body.get("epoch"), "epoch")
        if event not in MEMBER_EVENTS:
            raise p.BadField(f"unknown member event {str(event)[:60]!r}")
        if self._replica.member_event(event, member, epoch):
            self._emit(Event(event, rank=member.rank, engine=member.engine, clock=member.clock))

    def _rejoin(self) -> None:
        """Declared dead, but alive (a pause, a stall): register again as a joiner of the same
        rank, so that a donor sends the state this peer missed."""
        self._rejoined_from_beat = self._listener.next_beat_id
        try:
            reply, blobs = self._requester.request(self._register_body(join=True))
        except ControlError:
            self._life.expel()
            self._emit(Event("expelled", rank=self.rank))
            return
        self._apply_registration(reply, blobs, admitted=True)
        self._emit(Event("readmitted", rank=self.rank, clock=self.start_clock,
                         engine=self.donor.engine if self.donor else None))

    def _emit(self, event: Event) -> None:
        self.events.put(event)
        for callback in self._callbacks:
            callback(event)

    # -- failover (on the background thread) ----------------------------------------------------------

    def _find_coordinator(self, receive_pending: Callable[[], None]) -> bool:
        """Find the coordinator again (the same one if it was only slow, else the successor) and
        follow it; False once there is none to follow (see ``Failover.find``)."""
        self.failovers += 1
        found = self._failover.find(self._term, self.rank, receive_pending)
        if found is None:
            return False
        try:
            self._follow(*found)
        finally:
            self._life.follow()
        return True

    def _follow(self, endpoint: str, hello: dict, resumed: bool) -> None:
        """Switch to the coordinator at ``endpoint``; after a failover, re-register there and hand it
        this peer's membership and view (the first such hand-over rebuilds its state)."""
        if resumed or endpoint != self._requester.endpoint:  # a new process: nothing queued for the old one goes there
            self._requester.switch(endpoint)
        self._pub_endpoint = reachable(hello["pub"], endpoint)
        self._term = max(self._term, hello["term"])
        self._listener.restart_detector()
        if resumed:
            # Said once per failover: where to point a peer restarted on a host without this one.
            log.warning("p2plearn rank %s: following the coordinator at %s (term %d)", self.rank, endpoint, self._term)
            self.coordinator_changes += 1
            self._replica.restart()
            if self._life.phase.member:
                self._resume()
            self._emit(Event("coordinator_moved", endpoint=endpoint))

    def _resume(self) -> None:
        view = self.view
        header, blobs = view.to_blobs() if view is not None else (None, None)
        resume = {"clock": self._clock, "epoch": max(self._replica.epoch, 0), "view": header,
                  "members": [m.to_dict() for m in self.members.values()]}
        try:
            reply, blobs_in = self._requester.request(self._register_body(join=False, resume=resume), blobs=blobs)
            behind = bool(reply.get("donor"))  # the successor found this peer behind the job: take a state
            with checked("registration"):
                self._apply_registration(reply, blobs_in, admitted=behind)
        except ControlError:
            return  # the detector notices a successor that does not answer
        if behind:
            self._emit(Event("readmitted", rank=self.rank, clock=self.start_clock, engine=self.donor.engine))
