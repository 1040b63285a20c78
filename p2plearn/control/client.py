"""The control-plane client that lives in every peer.

Two threads touch ZeroMQ: the caller's (requests, under a lock) and a background thread that
sends heartbeats, receives the coordinator's pushed events (membership, slowest clock, global
view, donor requests) and notices a dead coordinator. Every call has a timeout; once the
coordinator is known dead every call raises CoordinatorDead instead of waiting.
"""

from __future__ import annotations

import itertools
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import zmq

from . import protocol as p
from .membership import Event, Member
from .view import GlobalView


class ControlError(RuntimeError):
    """The coordinator refused a request or could not be reached in time."""


class Refused(ControlError):
    """The coordinator refused this peer (wrong job id or key, or a rank already taken)."""


class CoordinatorDead(ControlError):
    """The coordinator stopped answering (no tick for ``dead_after`` heartbeats)."""


class Client:
    """Connect a peer to the coordinator at ``address`` (``host:port``, ``tcp://...`` or ``ipc://...``).

    - ``job_id`` / ``key``: from ``P2PLEARN_JOB_ID`` / ``P2PLEARN_JOB_KEY``; a mismatch is refused.
    - ``rank``: this peer's rank; None for a joining peer that lets the coordinator choose.
    - ``timeout``: seconds any single request may take before ControlError; raise it only on
      a very slow network (requests are small).
    - ``connect_timeout``: how long to keep trying to reach a coordinator that is still starting
      (rank 0 may start it a moment after the others).
    - ``host``: the host name reported to others (default: this machine's name).
    The heartbeat period and the number of missed heartbeats are the coordinator's settings.
    """

    def __init__(self, address: str, job_id: str, key: str | bytes, *, rank: int | None = None,
                 timeout: float = 5.0, connect_timeout: float = 30.0, host: str | None = None) -> None:
        self.job_id = job_id
        self.rank = rank
        self.timeout = timeout
        self.host = host or socket.gethostname()
        self.events: queue.Queue[Event] = queue.Queue()
        self.donor: Member | None = None
        self.start_clock = 0
        self._endpoint = p.endpoint(address)
        self._key = p.job_key(key)
        self._session = uuid.uuid4().hex
        self._ids = itertools.count()
        self._callbacks: list[Callable[[Event], None]] = []
        self._members: dict[int, Member] = {}
        self._epoch = -1
        self._gap = False
        self._min_clock = 0
        self._view: GlobalView | None = None
        self._registered = False
        self._dead = False
        self._closed = threading.Event()
        self._cond = threading.Condition()
        self._req_lock = threading.Lock()
        self._ctx = zmq.Context.instance()
        self._req = self._socket(zmq.DEALER, self._endpoint)
        try:
            hello = self._hello(connect_timeout)
        except BaseException:
            self._req.close()
            raise
        self.heartbeat = float(hello["heartbeat"])
        self.dead_after = int(hello["dead_after"])
        self.world_size = int(hello["world_size"])
        self._pub_endpoint = _reachable(hello["pub"], self._endpoint)
        self._last_heard = time.monotonic()
        self._subscribed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="p2plearn-control-client", daemon=True)
        self._thread.start()
        self._subscribed.wait(timeout)

    def _socket(self, kind: int, endpoint: str) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        return sock

    # -- requests ---------------------------------------------------------------------------

    def _send(self, sock: zmq.Socket, body: dict[str, Any]) -> None:
        sock.send_multipart(p.pack(self._key, self.job_id, body), flags=zmq.NOBLOCK)

    def _request(self, body: dict[str, Any], timeout: float | None = None) -> tuple[dict, list[bytes]]:
        """Send ``body`` and wait for its reply; raises ControlError on refusal or timeout."""
        self._check()
        timeout = self.timeout if timeout is None else timeout
        rid = next(self._ids)
        with self._req_lock:
            try:
                self._send(self._req, {**body, "id": rid, "session": self._session})
            except zmq.Again:
                raise ControlError(f"cannot send {body['type']} to the coordinator at {self._endpoint}") from None
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                if not self._req.poll(left * 1000):
                    break
                frames = self._req.recv_multipart()
                refusal = p.parse_refusal(frames)
                if refusal is not None and refusal.get("id") == rid:
                    raise Refused(f"coordinator at {self._endpoint} refused {body['type']}: {refusal['reason']}")
                try:
                    reply, blobs = p.unpack(self._key, self.job_id, frames)
                except p.AuthError:
                    continue  # not from our coordinator: ignore, do not trust
                if reply.get("id") != rid:
                    continue  # a late reply to an earlier request that timed out
                if reply["type"] == p.ERROR:
                    raise ControlError(f"coordinator refused {body['type']}: {reply['reason']}")
                return reply, blobs
        self._check()
        raise ControlError(f"no reply to {body['type']} from the coordinator at {self._endpoint} in {timeout:g} s")

    def _hello(self, connect_timeout: float) -> dict:
        """Reach the coordinator, retrying while it may still be starting."""
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                return self._request({"type": p.HELLO}, timeout=min(self.timeout, 1.0))[0]
            except Refused:
                raise
            except ControlError:
                if time.monotonic() >= deadline:
                    raise ControlError(f"no coordinator answered at {self._endpoint} within {connect_timeout:g} s") from None

    def _check(self) -> None:
        if self._dead:
            raise CoordinatorDead(f"the coordinator at {self._endpoint} is dead (no tick for "
                                  f"{self.dead_after} heartbeats of {self.heartbeat:g} s)")
        if self._closed.is_set():
            raise ControlError("the control client is closed")

    # -- public API ------------------------------------------------------------------------------

    def register(self, engine: tuple[str, int] | None = None, *, join: bool = False) -> dict[int, Member]:
        """Join the membership with this peer's data-engine address; returns the members.

        Calling it again updates the engine address. With ``join=True`` the peer joins a
        running job: ``self.donor`` is the live peer that will send it the model state (None if
        it is alone) and ``self.start_clock`` the clock it takes part from.
        """
        reply, _ = self._request({"type": p.REGISTER, "rank": self.rank, "host": self.host,
                                  "engine": list(engine) if engine else None, "join": join})
        self.rank = int(reply["rank"])
        self.start_clock = int(reply["clock"])
        if reply.get("donor"):
            self.donor = Member.from_dict(reply["donor"])
        self._apply_snapshot(reply)
        self._registered = True
        return self.members

    def report(self, clock: int, *, loss: float | None = None, step_time: float | None = None,
               saturated: bool = False, links: Mapping[int, Mapping[str, float]] | None = None) -> None:
        """Report a finished round (one-way, does not wait).

        ``clock``: rounds this peer has completed; ``loss``: training loss (for the progress
        line); ``step_time``: seconds of the round; ``links[receiver]``: what the engine measured
        towards it: ``rate`` (bytes/s delivered), ``loss`` (0..1), ``bytes``,
        ``in_flight_bytes``, ``in_flight_msgs``; ``saturated``: the engine had data queued for
        the whole send (see ``estimator`` for why it matters).
        """
        self._check()
        body = {"type": p.REPORT, "rank": self.rank, "session": self._session, "clock": int(clock),
                "loss": loss, "step_time": step_time, "saturated": saturated,
                "links": {str(j): dict(s) for j, s in (links or {}).items()}}
        with self._req_lock:
            try:
                self._send(self._req, body)
            except zmq.Again:
                raise ControlError(f"cannot send a report to the coordinator at {self._endpoint}") from None

    def leave(self) -> None:
        """Deregister cleanly; the others are told at once."""
        if self._registered and not self._dead:
            self._request({"type": p.LEAVE, "rank": self.rank})
        self._registered = False

    def plan(self, round: int, *, policy: str, fanout: int, seed: int, message_bytes: int,
             timeout: float | None = None) -> dict[str, Any]:
        """This round's plan as it concerns this peer (the coordinator computes one per round):
        ``receivers`` [(rank, pacing rate in bytes/s)], ``senders`` [ranks that send to it],
        ``planned_time`` (T of the plan, seconds) and ``fanout`` (the plan's average p)."""
        reply, _ = self._request({"type": p.PLAN, "round": int(round), "rank": self.rank, "policy": policy,
                                  "fanout": int(fanout), "seed": int(seed), "bytes": int(message_bytes)}, timeout)
        reply["receivers"] = [(int(j), float(rate)) for j, rate in reply["receivers"]]
        return reply

    def fetch_view(self, timeout: float | None = None) -> GlobalView:
        """Ask for the current GlobalView (``view`` holds the one pushed each round)."""
        reply, blobs = self._request({"type": p.VIEW}, timeout)
        view = GlobalView.from_blobs(reply["view"], blobs)
        with self._cond:
            self._view = view
        return view

    @property
    def view(self) -> GlobalView | None:
        """The GlobalView pushed when the slowest clock last advanced (None before the first)."""
        with self._cond:
            return self._view

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

    def wait_min_clock(self, target: int, timeout: float) -> bool:
        """Wait until the slowest live clock reaches ``target``; False on timeout (SSP decides
        what to do then), CoordinatorDead if the coordinator dies meanwhile."""
        with self._cond:
            self._cond.wait_for(lambda: self._min_clock >= target or self._dead, timeout)
            self._check()
            return self._min_clock >= target

    def wait_members(self, count: int, timeout: float) -> dict[int, Member]:
        """Wait until ``count`` peers are live members (rendezvous); ControlError on timeout."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._members) >= count or self._dead, timeout):
                missing = sorted(set(range(count)) - set(self._members))
                raise ControlError(f"only {len(self._members)} of {count} peers registered within "
                                   f"{timeout:g} s (missing ranks {missing})")
            self._check()
            return dict(self._members)

    def on_event(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback(event)`` on the client's thread for each event; keep it short (hand
        long work, like sending state to a joiner, to another thread or poll ``events``)."""
        self._callbacks.append(callback)

    def close(self) -> None:
        """Stop heartbeats and release the sockets (does not deregister: see ``leave``)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(timeout=2.0)
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
        sub = self._socket(zmq.SUB, self._pub_endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        beat = self._socket(zmq.DEALER, self._endpoint)
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(beat, zmq.POLLIN)
        next_beat = 0.0
        try:
            while not self._closed.is_set():
                for sock, _ in poller.poll(timeout=self.heartbeat * 200):  # a fifth of a period, in ms
                    while sock.poll(0):
                        self._receive(sock, beat, sock.recv_multipart())
                now = time.monotonic()
                if now - self._last_heard > self.heartbeat * self.dead_after:
                    self._declare_dead()
                    return
                if now >= next_beat:
                    if self._registered:
                        self._beat(beat)
                    next_beat = now + self.heartbeat
        finally:
            sub.close()
            beat.close()

    def _beat(self, beat: zmq.Socket) -> None:
        try:
            self._send(beat, {"type": p.HEARTBEAT, "rank": self.rank, "session": self._session})
        except zmq.Again:
            pass  # queue full: the coordinator is not reading; its silence will tell

    def _receive(self, sock: zmq.Socket, beat: zmq.Socket, frames: list[bytes]) -> None:
        try:
            body, blobs = p.unpack(self._key, self.job_id, frames)
        except p.AuthError:
            return  # a stranger's message: drop it
        self._last_heard = time.monotonic()
        kind = body["type"]
        if kind == p.TICK:
            self._subscribed.set()
            with self._cond:
                stale = self._gap or body["epoch"] > self._epoch
                self._set_clock(body["min_clock"])
            if stale and self._registered:  # a pushed membership event was missed: resync
                try:
                    self._send(beat, {"type": p.MEMBERS})
                except zmq.Again:
                    pass
        elif kind == p.OK and "members" in body:
            self._apply_snapshot(body)
        elif kind == p.ERROR and body.get("expelled") and self._registered:
            self._registered = False
            self._emit(Event("expelled", rank=self.rank))
        elif kind == p.MEMBER:
            self._on_member(body)
        elif kind == p.CLOCK:
            with self._cond:
                self._set_clock(body["min_clock"])
        elif kind == p.VIEW:
            view = GlobalView.from_blobs(body["view"], blobs)
            with self._cond:
                self._view = view
        elif kind == p.DONATE and body["to"] == self.rank:
            engine = body.get("engine")
            self._emit(Event("donate", rank=body["rank"], engine=tuple(engine) if engine else None,
                             clock=body["clock"]))

    def _on_member(self, body: dict) -> None:
        member = Member.from_dict(body["member"])
        with self._cond:
            if body["epoch"] <= self._epoch:
                return  # already in a snapshot
            # An event was missed in between: the next tick resyncs the whole membership.
            self._gap = self._gap or body["epoch"] != self._epoch + 1
            self._epoch = body["epoch"]
            if body["event"] in ("join", "update"):
                self._members[member.rank] = member
            else:
                self._members.pop(member.rank, None)
            self._cond.notify_all()
        self._emit(Event(body["event"], rank=member.rank, engine=member.engine, clock=member.clock))

    def _apply_snapshot(self, body: dict) -> None:
        with self._cond:
            if body["epoch"] < self._epoch:
                return
            self._epoch = body["epoch"]
            self._gap = False
            self._members = {m.rank: m for m in map(Member.from_dict, body["members"])}
            self._set_clock(body["min_clock"])
            self._cond.notify_all()

    def _set_clock(self, clock: int) -> None:
        """Called with the condition held."""
        if clock != self._min_clock:
            self._min_clock = clock
            self._cond.notify_all()

    def _declare_dead(self) -> None:
        with self._cond:
            self._dead = True
            self._cond.notify_all()
        self._emit(Event("coordinator_dead"))

    def _emit(self, event: Event) -> None:
        self.events.put(event)
        for callback in self._callbacks:
            callback(event)


def _reachable(pub: str, request_endpoint: str) -> str:
    """The PUB endpoint as seen from here: the host this client used, with the PUB port."""
    if pub.startswith("tcp://") and request_endpoint.startswith("tcp://"):
        return request_endpoint.rsplit(":", 1)[0] + ":" + pub.rsplit(":", 1)[1]
    return pub
