"""The control-plane client that lives in every peer (and in the launcher, as an observer).

Two threads touch ZeroMQ: the caller's (requests, under a lock) and a background thread that
sends heartbeats, receives the coordinator's pushed events (membership, slowest clock, global
view, donor requests, progress) and watches the coordinator with a phi-accrual detector.

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

import itertools
import logging
import os
import queue
import socket
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..keys import control_key
from ..transport.nic import link_rate
from . import protocol as p
from .coordinator import Progress, set_transport_heartbeat
from .detector import PhiAccrualDetector
from .membership import Event, Member
from .view import GlobalView

log = logging.getLogger("p2plearn.control")
WAIT_NOTICE_S = 5.0  # start-up waits longer than this say what they wait for
MESSAGES = (p.TICK, p.MEMBER, p.CLOCK, p.VIEW, p.DONATE, p.MOVED, p.ENDED, p.OK, p.ERROR)  # what a client is sent
MEMBER_EVENTS = ("join", "update", "leave", "dead")
VIEWS_KEPT = 16        # views held at once (a new one may apply a few rounds ahead)
OLD_COORDINATOR_S = 1.0  # how long a suspected coordinator is asked again before looking for a successor
# A successor this peer starts exits once no peer has been registered there for SUCCESSOR_LINGER_S
# (the job ended), or if none registers within SUCCESSOR_GRACE_S (this peer re-registers at once).
SUCCESSOR_LINGER_S = 1.0
SUCCESSOR_GRACE_S = 10.0


class ControlError(RuntimeError):
    """The coordinator refused a request or could not be reached in time."""


class Refused(ControlError):
    """The coordinator refused this peer (wrong job id or key, or a rank already taken)."""


class SelfConnected(ControlError):
    """A request came back as its own reply: nothing listened on the coordinator's port yet and the
    connect, from a source port equal to it, reached this socket itself (TCP simultaneous open)."""


class CoordinatorDead(ControlError):
    """No coordinator, not even a successor, answered for the client's ``give_up`` seconds."""


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
        self.rank = rank
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
        self.rejected: Counter[str] = Counter()  # malformed messages from a key holder, by type, dropped
        self._standby = standby
        self._secret = key  # a successor this peer starts derives its keys from it too
        self._key = control_key(key)
        self._session = uuid.uuid4().hex
        self._ids = itertools.count()
        self._beats = itertools.count()
        self._next_beat_id = 0
        self._rejoined_from_beat = 0  # expelled answers to heartbeats sent before a rejoin are stale
        self._callbacks: list[Callable[[Event], None]] = []
        self._members: dict[int, Member] = {}
        # The most members, and receivers a view planned, at once since this client followed its
        # coordinator (as seen here, or as the coordinator's snapshots say: events published before
        # this client's subscription was live never come): a start-up wait is over once they reached
        # the job size, even if fast peers finished and left before this peer's thread looked (on a
        # busy host it may sleep for seconds).
        self._most_members = 0
        self._most_planned = 0
        self._epoch = -1
        self._gap = False
        self._min_clock = 0
        self._clock = 0           # the last clock this peer reported
        self._views: list[GlobalView] = []
        self._progress: Progress | None = None
        self._engine: tuple[str, int] | None = None
        self._registered = False
        self._failing_over = False
        self._moved_to: str | None = None
        self._spawned: Any = None  # the coordinator process this peer started as a successor
        self._dead = False
        self._ended = False  # the coordinator said the job ended
        self._left = False   # leave() was called: this peer is no longer part of the job
        self._closed = threading.Event()
        self._cond = threading.Condition()
        self._req_lock = threading.Lock()
        self._ctx = zmq.Context.instance()
        self._endpoint = p.endpoint(address)
        self._req = self._socket(zmq.DEALER, self._endpoint)
        try:
            hello = self._hello(connect_timeout)
        except BaseException:
            self._req.close()
            raise
        self.heartbeat = hello["heartbeat"]
        self.world_size = hello["world_size"]
        self._settings = {k: hello[k] for k in ("phi_threshold", "startup_grace")}
        self._term = hello["term"]
        self._pub_endpoint = _reachable(hello["pub"], self._endpoint)
        self._detector = self._new_detector()
        self._subscribed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="p2plearn-control-client", daemon=True)
        self._thread.start()
        self._subscribed.wait(timeout)

    def _socket(self, kind: int, endpoint: str) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        return sock

    def _new_detector(self) -> PhiAccrualDetector:
        # Ticks come from a process of its own, so no start-up grace beyond a few heartbeats; the
        # extra pause tolerated costs a failover a second, and saves one on a stall of this process.
        return PhiAccrualDetector(self.heartbeat, threshold=self._settings["phi_threshold"],
                                  acceptable_pause=max(2.0, 4 * self.heartbeat), grace=max(3.0, 6 * self.heartbeat))

    # -- requests ---------------------------------------------------------------------------

    def _send(self, sock: zmq.Socket, body: dict[str, Any], blobs: list[bytes] | None = None) -> None:
        sock.send_multipart(p.pack(self._key, self.job_id, body, blobs), flags=zmq.NOBLOCK)

    def _request(self, body: dict[str, Any], timeout: float | None = None, *, sock: zmq.Socket | None = None,
                 blobs: list[bytes] | None = None) -> tuple[dict, list[bytes]]:
        """Send ``body`` and wait for its reply; raises ControlError on refusal or timeout."""
        self._check()
        timeout = self.timeout if timeout is None else timeout
        rid = next(self._ids)
        with self._req_lock:
            sock = sock or self._req
            try:
                self._send(sock, {**body, "id": rid, "session": self._session}, blobs)
            except zmq.Again:
                raise ControlError(f"cannot send {body['type']} to the coordinator at {self._endpoint}") from None
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                if not sock.poll(left * 1000):
                    break
                frames = sock.recv_multipart()
                refusal = p.parse_refusal(frames)
                if refusal is not None and refusal.get("id") == rid:
                    raise Refused(f"coordinator at {self._endpoint} refused {body['type']}: {refusal['reason']}")
                try:
                    reply, blobs_in = p.unpack(self._key, self.job_id, frames)
                except p.AuthError:
                    continue  # not from our coordinator: ignore, do not trust
                if reply.get("type") == body["type"] and reply.get("session") == self._session:
                    raise SelfConnected(f"{body['type']} to {self._endpoint} came back from this socket itself")
                if reply.get("id") != rid:
                    continue  # a late reply to an earlier request that timed out
                if reply["type"] == p.ERROR:
                    raise ControlError(f"coordinator refused {body['type']}: {reply['reason']}")
                return reply, blobs_in
        self._check()
        raise ControlError(f"no reply to {body['type']} from the coordinator at {self._endpoint} in {timeout:g} s")

    def _hello(self, connect_timeout: float, sock: zmq.Socket | None = None, endpoint: str | None = None) -> dict:
        """Reach the coordinator (through ``sock``, connected to ``endpoint``; default: this client's
        own), retrying while it may still be starting; its settings, checked."""
        start = time.monotonic()
        noticed = False
        while True:
            try:
                reply = self._request({"type": p.HELLO}, timeout=min(self.timeout, 1.0), sock=sock)[0]
                break
            except Refused:
                raise
            except ControlError as exc:
                if isinstance(exc, SelfConnected):  # connect again: a new source port, the listener by then
                    reconnect = sock or self._req
                    reconnect.disconnect(endpoint or self._endpoint)
                    reconnect.connect(endpoint or self._endpoint)
                waited = time.monotonic() - start
                if waited >= connect_timeout:
                    raise ControlError(f"no coordinator answered at {self._endpoint} within {connect_timeout:g} s") from None
                if waited >= WAIT_NOTICE_S and not noticed and sock is None:
                    noticed = True
                    log.warning("p2plearn: waiting for the coordinator at %s (%.0f s so far; rank 0 starts it)",
                                self._endpoint, waited)
        with _checked("hello"):
            return _hello_settings(reply)

    def _check(self) -> None:
        if self._dead:
            raise CoordinatorDead(f"no coordinator of job {self.job_id!r} answered for {self.give_up:g} s "
                                  f"(last at {self._endpoint}), and no successor could be started")
        if self._ended:
            raise ControlError(f"the coordinator of job {self.job_id!r} stopped: the job ended")
        if self._closed.is_set():
            raise ControlError("the control client is closed")

    # -- public API ------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """The endpoint of the coordinator this client follows now."""
        return self._endpoint

    @property
    def standby(self) -> str:
        """Where this peer hosts the coordinator should it become the successor."""
        if self._standby is None:
            self._standby = _standby_endpoint(self._endpoint, self._session)
        return self._standby

    def register(self, engine: tuple[str, int] | None = None, *, join: bool = False) -> dict[int, Member]:
        """Join the membership with this peer's data-engine address; returns the members.

        Calling it again updates the engine address. With ``join=True`` the peer joins a
        running job: ``self.donor`` is the live peer that will send it the model state (None if
        it is alone) and ``self.start_clock`` the clock it takes part from.
        """
        self._engine = engine or self._engine
        reply, blobs = self._request(self._register_body(join))
        with _checked("registration"):
            self._apply_registration(reply, blobs, admitted=join or not self._registered)
        self._registered = True
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
        snapshot, view = _snapshot(reply), GlobalView.from_blobs(reply.get("view"), blobs)
        self.rank = rank
        if admitted:
            self.start_clock, self.donor = clock, donor
        self._apply_snapshot(*snapshot)
        self._add_view(view)

    def ask_for_state(self) -> Member | None:
        """Ask the coordinator for a donor again (the state from the last one did not come);
        returns the new donor (None: no live peer holds a state)."""
        reply, _ = self._request({"type": p.STATE, "rank": self.rank})
        with _checked("donor"):
            self.donor = Member.from_dict(reply["donor"]) if reply.get("donor") else None
        return self.donor

    def report(self, clock: int, *, loss: float | None = None, step_time: float | None = None,
               links: Mapping[int, Mapping[str, float]] | None = None, load: Mapping[str, float] | None = None,
               message_bytes: int | None = None) -> None:
        """Report a finished round (one-way, never waits; dropped while no coordinator is reachable).

        ``clock``: rounds this peer has completed; ``loss``: training loss (for the progress
        line); ``step_time``: seconds of the round; ``links[receiver]``: what the engine measured
        towards it: ``paced`` (the pacing rate, bytes/s; 0 = unpaced), ``rate`` (the ACK-based
        delivery rate, bytes/s; 0 = too short to time), ``probe`` (the end(s) the flow probed),
        ``multicast`` (it went through this peer's group: one copy for all such) (see ``estimator``);
        ``load``: this peer's ``compute_s``, ``merge_s``, ``backlog``, ``in_flight_bytes`` and
        ``in_flight_msgs`` (see ``GlobalView``); ``message_bytes``: the size of this peer's
        message (the plans weigh it).
        """
        if self._ended:
            self.dropped_reports += 1  # nobody collects reports once the job's coordinator stopped
            return
        self._check()
        self._clock = max(self._clock, int(clock))
        body = {"type": p.REPORT, "rank": self.rank, "session": self._session, "clock": int(clock),
                "loss": loss, "step_time": step_time, "message_bytes": message_bytes, "load": dict(load or {}),
                "links": {str(j): dict(s) for j, s in (links or {}).items()}}
        if self._failing_over:
            self.dropped_reports += 1
            return
        with self._req_lock:
            try:
                self._send(self._req, body)
            except zmq.Again:
                self.dropped_reports += 1  # the coordinator is not reading; the detector will tell

    def report_reach(self, reached: Iterable[int]) -> None:
        """Tell the coordinator which ranks this peer's multicast probe reached
        (``Channel.probe_multicast``); the view's ``mcast_domain`` follows from every peer's report.
        Raises ControlError if the coordinator refuses it."""
        self._request({"type": p.REACH, "rank": self.rank, "reached": sorted(int(j) for j in reached)})

    def leave(self) -> None:
        """Deregister cleanly; the others are told at once. From now on this client starts no
        successor, should the coordinator go quiet (it stops at the end of the job)."""
        self._left = True
        if self._registered and not self._dead and not self._ended:
            self._request({"type": p.LEAVE, "rank": self.rank})
        self._registered = False

    def fetch_view(self, timeout: float | None = None) -> GlobalView:
        """Ask for the current GlobalView (``view`` holds the newest one pushed)."""
        reply, blobs = self._request({"type": p.VIEW}, timeout)
        with _checked("view"):
            view = GlobalView.from_blobs(reply.get("view"), blobs)
        self._add_view(view)
        return view

    @property
    def view(self) -> GlobalView | None:
        """The newest GlobalView held (None before the first)."""
        with self._cond:
            return self._views[-1] if self._views else None

    def view_for(self, round: int) -> GlobalView | None:
        """The view that plans ``round``: the newest whose ``from_round`` is at most ``round``
        (every peer holding the same views picks the same one)."""
        with self._cond:
            usable = [v for v in self._views if v.from_round <= round]
            return usable[-1] if usable else (self._views[0] if self._views else None)

    @property
    def members(self) -> dict[int, Member]:
        """The live members by rank, as last pushed."""
        with self._cond:
            return dict(self._members)

    @property
    def min_clock(self) -> int:
        """The slowest live peer's clock, as last pushed."""
        with self._cond:
            return self._min_clock

    @property
    def progress(self) -> Progress | None:
        """The job's progress, as the coordinator's last tick said (None before the first)."""
        with self._cond:
            return self._progress

    @property
    def following(self) -> bool:
        """False while the client is looking for a (new) coordinator, and once the job ended."""
        return not self._failing_over and not self._dead and not self._ended

    @property
    def ended(self) -> bool:
        """Whether the coordinator said the job ended (it stopped; no successor follows)."""
        return self._ended

    @property
    def clock_current(self) -> bool:
        """Whether ``min_clock`` is the coordinator's current one: it ticks every heartbeat, and one
        came within the pause its detector forgives (a busy host delays ticks). A hung coordinator
        is known (``following``) only seconds later; a wait on the clock should not outlast that."""
        return self.following and time.monotonic() - self._detector.last < self._detector.acceptable_pause

    def wait_min_clock(self, target: int, timeout: float) -> bool:
        """Wait until the slowest live clock reaches ``target``; False on timeout (SSP decides
        what to do then), CoordinatorDead once the client gave up on every coordinator."""
        with self._cond:
            self._cond.wait_for(lambda: self._min_clock >= target or self._dead or self._ended, timeout)
            self._check()
            return self._min_clock >= target

    def wait_members(self, count: int, timeout: float, *, receiving: bool = False) -> dict[int, Member]:
        """Wait until ``count`` peers are, or once were, live members at the same time; with
        ``receiving``, also until a view planned them all as receivers (their engines are known),
        so that every peer plans its first round from the same view. "Once were" counts since this
        client followed its coordinator: peers that finished and left meanwhile do not undo the
        start, nor does the end of the job (the others trained and left). Returns the members now.
        ControlError on timeout, or when the job ended before it started."""
        def started() -> bool:
            return self._most_members >= count and (not receiving or self._most_planned >= count)

        def ready() -> bool:
            return self._dead or self._ended or started()

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
                if self.rank == 0:  # one line for the job, not one per rank
                    log.warning("p2plearn: waiting for %s after %.0f s", awaited(), waited)
            if self._dead or not started():
                self._check()
            return dict(self._members)

    def wait_alone(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s until no other peer is a member (each left or was declared
        dead), or the job ended; True if so. The peer that started the coordinator calls it after
        ``leave()`` and before stopping the coordinator (a peer finishing a moment later still finds
        it), and before ``close()``: a closed client's membership is no longer kept up to date."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._dead or self._ended or all(r == self.rank for r in self._members), timeout)

    def on_event(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback(event)`` on the client's thread for each event; keep it short (hand
        long work, like sending state to a joiner, to another thread or poll ``events``)."""
        self._callbacks.append(callback)

    def close(self) -> None:
        """Stop heartbeats and release the sockets (does not deregister: see ``leave``).

        A coordinator this peer started as a successor keeps serving the others; it ends by itself
        once the job has no member."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(timeout=2.0 + (self.timeout if self._failing_over else 0.0))
        with self._req_lock:
            self._req.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self.leave()
        finally:
            self.close()

    # -- background thread -------------------------------------------------------------------------

    def _run(self) -> None:
        streams = self._open_streams()
        next_beat = 0.0
        try:
            while not self._closed.is_set():
                sub, beat, monitor, poller = streams
                for sock, _ in poller.poll(timeout=self.heartbeat * 200):  # a fifth of a period, in ms
                    if sock is monitor:
                        if recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED:
                            self._detector.lost()  # the coordinator's process closed its end
                        continue
                    self._receive_pending(sock, beat)
                now = time.monotonic()
                # A peer that left, or whose job ended, follows no successor; one that left keeps
                # listening (it may wait until it is alone), for a suspicion may be a busy host.
                if self._in_job() and (self._moved_to or self._detector.suspected(now)):
                    following = self._endpoint, self._pub_endpoint, self._term
                    if not self._failover(sub, beat):
                        return
                    if (self._endpoint, self._pub_endpoint, self._term) != following:
                        _close(streams)
                        streams = self._open_streams()
                    # else the coordinator was only slow (or this process was): the connections
                    # stay, for a member whose connections close is taken for a process that exited
                    continue
                if now >= next_beat:
                    if self._registered:
                        self._beat(beat)
                    next_beat = now + self.heartbeat
        finally:
            if streams:
                _close(streams)

    def _in_job(self) -> bool:
        """Whether this client still takes part in the job (it may start or follow a successor)."""
        return not (self._closed.is_set() or self._left or self._ended)

    def _open_streams(self) -> tuple[zmq.Socket, zmq.Socket, zmq.Socket, zmq.Poller]:
        """The SUB socket, the heartbeat DEALER, a monitor of the DEALER's connection, and their poller."""
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        p.subscribe_encrypted(sub, self._secret)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self._pub_endpoint)
        beat = self._ctx.socket(zmq.DEALER)
        beat.setsockopt(zmq.LINGER, 0)
        set_transport_heartbeat(beat, self.heartbeat)  # a paused or lost coordinator closes this connection
        beat.connect(self._endpoint)
        monitor = beat.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller = zmq.Poller()
        for sock in (sub, beat, monitor):
            poller.register(sock, zmq.POLLIN)
        return sub, beat, monitor, poller

    def _beat(self, beat: zmq.Socket) -> None:
        self._next_beat_id = next(self._beats) + 1
        try:
            self._send(beat, {"type": p.HEARTBEAT, "rank": self.rank, "session": self._session,
                              "id": self._next_beat_id - 1})
        except zmq.Again:
            pass  # queue full: the coordinator is not reading; its silence will tell

    def _receive_pending(self, sock: zmq.Socket, beat: zmq.Socket) -> None:
        while sock.poll(0):
            self._receive(sock, beat, sock.recv_multipart())

    def _receive(self, sock: zmq.Socket, beat: zmq.Socket, frames: list[bytes]) -> None:
        try:
            body, blobs = p.unpack(self._key, self.job_id, frames)
        except p.AuthError:
            return  # a stranger's message: drop it
        kind = body.get("type")
        try:
            self._on_message(kind, body, blobs, beat)
        except Exception:  # a key holder's malformed message: as if it never came, counted
            self.rejected[kind if kind in MESSAGES else "unknown"] += 1

    def _on_message(self, kind: str, body: dict, blobs: list[bytes], beat: zmq.Socket) -> None:
        """Apply one pushed event or late reply; every field is checked first (``protocol.BadField``)."""
        if kind == p.TICK:
            epoch, min_clock = p.integer(body.get("epoch"), "epoch"), p.integer(body.get("min_clock"), "min_clock")
            progress = Progress.from_dict(body["progress"]) if body.get("progress") else None
            self._detector.heartbeat()
            self._subscribed.set()
            with self._cond:
                stale = self._gap or epoch > self._epoch
                self._set_clock(min_clock)
                self._progress = progress or self._progress
            if stale:  # a pushed membership event was missed (or none was ever had): resync
                try:
                    self._send(beat, {"type": p.MEMBERS})
                except zmq.Again:
                    pass
        elif kind == p.OK and "members" in body:
            self._apply_snapshot(*_snapshot(body))
        elif kind == p.ERROR and body.get("expelled") is True and self._registered:
            if p.integer(body.get("id") or 0, "id") >= self._rejoined_from_beat:
                self._rejoin()
        elif kind == p.MEMBER:
            self._on_member(body)
        elif kind == p.CLOCK:
            min_clock = p.integer(body.get("min_clock"), "min_clock")
            with self._cond:
                self._set_clock(min_clock)
        elif kind == p.VIEW:
            self._add_view(GlobalView.from_blobs(body.get("view"), blobs))
        elif kind == p.DONATE:
            to, rank = (p.integer(body.get(name), name, 0, p.MAX_RANK) for name in ("to", "rank"))
            engine, clock = p.engine_address(body.get("engine")), p.integer(body.get("clock"), "clock")
            if to == self.rank:
                self._emit(Event("donate", rank=rank, engine=engine, clock=clock))
        elif kind == p.MOVED:
            term, endpoint = p.integer(body.get("term"), "term"), p.valid_endpoint(body.get("endpoint"), "endpoint")
            if term > self._term:
                self._moved_to = endpoint
        elif kind == p.ENDED and p.integer(body.get("term"), "term") >= self._term:
            members, planned = (p.integer(body.get(name, 0), name, 0, p.MAX_RANK + 1)
                                for name in ("most_members", "most_planned"))
            with self._cond:
                self._ended = True
                self._most_members = max(self._most_members, members)
                self._most_planned = max(self._most_planned, planned)
                self._cond.notify_all()
            self._emit(Event("job_ended"))

    def _rejoin(self) -> None:
        """Declared dead, but alive (a pause, a stall): register again as a joiner of the same
        rank, so that a donor sends the state this peer missed."""
        self._rejoined_from_beat = self._next_beat_id
        try:
            reply, blobs = self._request(self._register_body(join=True))
        except ControlError:
            self._registered = False
            self._emit(Event("expelled", rank=self.rank))
            return
        self._apply_registration(reply, blobs, admitted=True)
        self._emit(Event("readmitted", rank=self.rank, clock=self.start_clock,
                         engine=self.donor.engine if self.donor else None))

    def _on_member(self, body: dict) -> None:
        member, event = Member.from_dict(body.get("member")), body.get("event")
        epoch = p.integer(body.get("epoch"), "epoch")
        if event not in MEMBER_EVENTS:
            raise p.BadField(f"unknown member event {str(event)[:60]!r}")
        with self._cond:
            if epoch <= self._epoch:
                return  # already in a snapshot
            # An event was missed in between: the next tick resyncs the whole membership.
            self._gap = self._gap or epoch != self._epoch + 1
            self._epoch = epoch
            if event in ("join", "update"):
                self._members[member.rank] = member
            else:
                self._members.pop(member.rank, None)
            self._most_members = max(self._most_members, len(self._members))
            self._cond.notify_all()
        self._emit(Event(event, rank=member.rank, engine=member.engine, clock=member.clock))

    def _apply_snapshot(self, members: dict[int, Member], epoch: int, min_clock: int, most_members: int,
                        most_planned: int) -> None:
        """A membership snapshot (``_snapshot`` checks one from the wire)."""
        with self._cond:
            if epoch < self._epoch:
                return
            self._epoch = epoch
            self._gap = False
            self._members = members
            self._most_members = max(self._most_members, len(self._members), most_members)
            self._most_planned = max(self._most_planned, most_planned)
            self._set_clock(min_clock)
            self._cond.notify_all()

    def _add_view(self, view: GlobalView) -> None:
        with self._cond:
            views = [v for v in self._views if v.order != view.order] + [view]
            views.sort(key=lambda v: v.order)
            self._views = views[-VIEWS_KEPT:]
            self._most_planned = max(self._most_planned, int(view.alive.sum()))
            self._cond.notify_all()

    def _set_clock(self, clock: int) -> None:
        """Called with the condition held."""
        if clock != self._min_clock:
            self._min_clock = clock
            self._cond.notify_all()

    # -- failover ------------------------------------------------------------------------------------

    def _failover(self, sub: zmq.Socket, beat: zmq.Socket) -> bool:
        """Find the coordinator again (the same one if it was only slow, else the successor) and
        re-register there; False once ``give_up`` seconds passed without one, on close, or once the
        old coordinator's ``sub`` stream says that the job ended."""
        self._failing_over = True
        self.failovers += 1
        old, moved = self._endpoint, self._moved_to
        self._moved_to = None
        started = time.monotonic()
        try:
            while self._in_job():
                for endpoint, wait in self._candidates(old, moved):
                    hello = self._try_hello(endpoint, wait)
                    newer = hello is not None and hello["term"] > self._term
                    if hello is not None and (endpoint == old or newer):
                        # A later term at the old endpoint is a successor that took it over: hand over too.
                        self._follow(endpoint, hello, resumed=endpoint != old or newer)
                        return True
                    if time.monotonic() - started > self.give_up:
                        break
                    # A peer stopped (SIGSTOP) past the end of its job takes the silence for a death
                    # before its ENDED is read; it must not start a successor and train alone.
                    self._receive_pending(sub, beat)
                    if not self._in_job():
                        return False
                moved = None
                if time.monotonic() - started > self.give_up:
                    with self._cond:
                        self._dead = True
                        self._cond.notify_all()
                    self._emit(Event("coordinator_dead"))
                    return False
            return False
        finally:
            self._failing_over = False

    def _candidates(self, old: str, moved: str | None) -> Iterator[tuple[str, float]]:
        """(endpoint, seconds to wait for it): where the coordinator was said to move, the old one
        (it may only have been slow), then each live member's standby in rank order; this peer
        starts the successor itself when its turn comes."""
        if moved:
            yield moved, self.successor_wait
        yield old, OLD_COORDINATOR_S
        for member in sorted(self.members.values(), key=lambda m: m.rank):
            if member.rank == self.rank and self._registered and self._in_job():
                if self._start_successor(old):
                    yield self.standby, self.successor_wait
            elif member.standby:
                yield member.standby, self.successor_wait

    def _start_successor(self, old: str) -> bool:
        from .server import spawn  # a process only the successor starts

        if self._spawned is not None and self._spawned.alive():
            return True
        try:
            self._spawned = spawn(self.job_id, self._secret, bind=self.standby, world_size=self.world_size,
                                  heartbeat=self.heartbeat, term=self._term + 1, previous=old,
                                  linger=SUCCESSOR_LINGER_S, startup_timeout=SUCCESSOR_GRACE_S,
                                  **self._settings)
        except RuntimeError as exc:  # e.g. the standby port was taken since: the next candidate serves
            self._emit(Event("successor_failed", rank=self.rank, endpoint=str(exc)))
            return False
        return True

    def _try_hello(self, endpoint: str, wait: float) -> dict | None:
        try:
            sock = self._socket(zmq.DEALER, endpoint)
        except zmq.ZMQError:
            return None  # an endpoint libzmq cannot connect to (a host name it cannot resolve, say)
        try:
            return self._hello(wait, sock=sock, endpoint=endpoint)
        except ControlError:
            return None
        finally:
            sock.close()

    def _follow(self, endpoint: str, hello: dict, resumed: bool) -> None:
        """Switch to the coordinator at ``endpoint``; after a failover, re-register there and hand it
        this peer's membership and view (the first such hand-over rebuilds its state)."""
        if resumed or endpoint != self._endpoint:  # a new process: nothing queued for the old one goes there
            with self._req_lock:
                self._req.close()
                self._req = self._socket(zmq.DEALER, endpoint)
        self._endpoint = endpoint
        self._pub_endpoint = _reachable(hello["pub"], endpoint)
        self._term = max(self._term, hello["term"])
        self._detector = self._new_detector()
        if resumed:
            # Said once per failover: where to point a peer restarted on a host without this one.
            log.warning("p2plearn rank %s: following the coordinator at %s (term %d)", self.rank, endpoint, self._term)
            self.coordinator_changes += 1
            with self._cond:
                self._epoch = -1  # the successor numbers its own membership events
                self._most_members = self._most_planned = 0  # and rebuilds the membership
            if self._registered:
                self._resume()
            self._emit(Event("coordinator_moved", endpoint=endpoint))

    def _resume(self) -> None:
        view = self.view
        header, blobs = view.to_blobs() if view is not None else (None, None)
        resume = {"clock": self._clock, "epoch": max(self._epoch, 0), "view": header,
                  "members": [m.to_dict() for m in self.members.values()]}
        try:
            reply, blobs_in = self._request(self._register_body(join=False, resume=resume), blobs=blobs)
            behind = bool(reply.get("donor"))  # the successor found this peer behind the job: take a state
            with _checked("registration"):
                self._apply_registration(reply, blobs_in, admitted=behind)
        except ControlError:
            return  # the detector notices a successor that does not answer
        if behind:
            self._emit(Event("readmitted", rank=self.rank, clock=self.start_clock, engine=self.donor.engine))

    def _emit(self, event: Event) -> None:
        self.events.put(event)
        for callback in self._callbacks:
            callback(event)


def _hello_settings(hello: dict) -> dict[str, Any]:
    """A coordinator's hello, checked: settings a client can run with, or ``protocol.BadField``."""
    return {"heartbeat": p.number(hello.get("heartbeat"), "heartbeat", 0.001, 60.0),
            "world_size": p.integer(hello.get("world_size"), "world_size", 0, p.MAX_RANK + 1),
            "pub": p.valid_endpoint(hello.get("pub"), "pub"), "term": p.integer(hello.get("term", 0), "term"),
            "phi_threshold": p.number(hello.get("phi_threshold", 8.0), "phi_threshold", 0.1, 1000.0),
            "startup_grace": p.number(hello.get("startup_grace", 60.0), "startup_grace", 0.0, 1e6)}


def _snapshot(body: dict) -> tuple[dict[int, Member], int, int, int, int]:
    """A membership snapshot from the wire, checked: (members by rank, epoch, min clock, the most
    members and planned receivers the coordinator ever had at once)."""
    members = body.get("members")
    if not isinstance(members, list):
        raise p.BadField("members must be a list")
    return ({m.rank: m for m in map(Member.from_dict, members)}, p.integer(body.get("epoch"), "epoch"),
            p.integer(body.get("min_clock"), "min_clock"),
            *(p.integer(body.get(name, 0), name, 0, p.MAX_RANK + 1) for name in ("most_members", "most_planned")))


@contextmanager
def _checked(what: str) -> Iterator[None]:
    """A malformed reply is the coordinator's fault: ControlError, as a refusal would be."""
    try:
        yield
    except p.BadField as exc:
        raise ControlError(f"malformed {what} from the coordinator: {exc}") from None


def _close(streams: tuple[zmq.Socket, zmq.Socket, zmq.Socket, zmq.Poller]) -> None:
    sub, beat, monitor, _ = streams
    beat.disable_monitor()
    for sock in (monitor, sub, beat):
        sock.close()


def _reachable(pub: str, request_endpoint: str) -> str:
    """The PUB endpoint as seen from here: the host this client used, with the PUB port."""
    if pub.startswith("tcp://") and request_endpoint.startswith("tcp://"):
        return request_endpoint.rsplit(":", 1)[0] + ":" + pub.rsplit(":", 1)[1]
    return pub


def _standby_endpoint(coordinator: str, session: str) -> str:
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
