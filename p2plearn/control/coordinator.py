"""The coordinator: soft state of one job (membership, failure detection, clock table, global view).

It serves two ZeroMQ sockets: a ROUTER for requests and heartbeats, and a PUB that pushes events
(joins, deaths, the slowest clock, each new version of the global view, and a tick every heartbeat
with the job's progress so that clients can tell that it is alive). Nothing here carries tensors,
and no training step waits on it: peers plan their rounds from the view they hold.

Everything it knows is rebuilt from the peers: when it dies, a successor (see ``Client``) starts
with ``term`` + 1, and the first peer to re-register hands it the membership and the view it held
(``resume``); the others re-register within a few heartbeats, and a presumed member that does not
is declared dead by the usual detector. A coordinator told of a successor (``STEP_DOWN``) tells its
clients where to go and stops; one stopped at the end of its job tells them so (``ENDED``), and
none of them looks for a successor.

It normally runs in a process of its own (``p2plearn.control.server``), so that a peer's imports
or compute cannot starve it; as a thread (``start()``) it serves tests and embedding programs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from ..keys import control_key
from . import protocol as p
from .detector import PhiAccrualDetector
from .estimator import BandwidthEstimator
from .membership import Member
from .view import FLOOR, PLANNING_INPUTS, GlobalView, domains_from_reach, reach_of

log = logging.getLogger("p2plearn.control")

VIEW_LEAD = 2        # a new view applies this many rounds after the fastest reported clock
REQUESTS = (p.HELLO, p.REGISTER, p.HEARTBEAT, p.REPORT, p.MEMBERS, p.VIEW, p.LEAVE, p.STEP_DOWN, p.STATE, p.REACH)
SUCCESSOR_CHECK_S = 5.0  # how long a successor named by a step_down has to answer, signed, with its term
RANK_HEADROOM = 1024  # a new rank may exceed the job's size by at most this (the view has an entry per rank)
ENDED_LINGER_MS = 500  # how long a stopped coordinator's PUB socket may take to deliver ENDED
LOAD = ("compute_s", "merge_s", "backlog", "in_flight_bytes", "in_flight_msgs")  # per peer, from its reports


@dataclass(frozen=True)
class Progress:
    """What the launcher shows: the slowest live clock and the highest clock ever reported, the
    mean loss of the live peers (after they are gone: the last loss reported), and the slowest
    peer (lowest clock, then longest step time)."""

    min_clock: int
    max_clock: int
    alive: int
    loss: float | None
    slowest: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"min_clock": self.min_clock, "max_clock": self.max_clock, "alive": self.alive,
                "loss": self.loss, "slowest": self.slowest}

    @classmethod
    def from_dict(cls, d: Any) -> Progress:
        """From a tick; raises ``protocol.BadField`` on anything malformed."""
        if not isinstance(d, dict):
            raise p.BadField(f"progress must be an object, got {str(d)[:60]}")
        slowest = d.get("slowest")
        return cls(min_clock=p.integer(d.get("min_clock"), "min_clock"),
                   max_clock=p.integer(d.get("max_clock"), "max_clock"),
                   alive=p.integer(d.get("alive"), "alive", 0, p.MAX_RANK + 1), loss=p.loss_value(d.get("loss")),
                   slowest=None if slowest is None else p.integer(slowest, "slowest", 0, p.MAX_RANK))


class Coordinator:
    """Serve the control plane of one job.

    - ``job_id`` / ``key``: messages not signed with ``key`` for ``job_id`` are refused.
    - ``world_size``: the initial size (the view has at least this many entries).
    - ``bind``: ZeroMQ endpoint for requests, e.g. ``tcp://127.0.0.1:0`` (0 = any free port),
      ``tcp://0.0.0.0:29450`` for other hosts, or ``ipc:///tmp/job/ctl`` (reachable from network
      namespaces, which share the file system). The PUB socket binds next to it.
    - ``advertise``: the host clients should use when ``bind`` is a wildcard address.
    - ``heartbeat``: seconds between client heartbeats (and coordinator ticks); smaller detects
      deaths sooner at the cost of more messages.
    - ``phi_threshold``: suspicion level at which a silent peer is declared dead (see
      ``PhiAccrualDetector``): lower detects sooner, with more false deaths on a loaded machine.
      A peer declared dead that comes back registers again and is sent the model state.
    - ``startup_grace``: a peer that has not finished its first round is declared dead after this
      many seconds without a heartbeat (its first imports may hold its interpreter for tens of
      seconds on a busy machine), or as soon as its connection closes or stops answering
      ZeroMQ's pings (a kill, a pause, a lost host: ~1.5 s).
    - ``rates``: ``{rank: (uplink, downlink)}`` in bytes/s seeding the estimator
      (``estimator.seed_rates(topology)`` makes one from a topology).
    - ``term``: this coordinator's incarnation (a successor has its predecessor's + 1).
    """

    def __init__(self, job_id: str, key: str | bytes, *, world_size: int = 0, bind: str = "tcp://127.0.0.1:0",
                 advertise: str | None = None, heartbeat: float = 0.5, phi_threshold: float = 8.0,
                 startup_grace: float = 60.0, rates: Mapping[int, tuple[float, float]] | None = None,
                 term: int = 0) -> None:
        self.job_id = job_id
        self.world_size = world_size
        self.heartbeat = heartbeat
        self.phi_threshold = phi_threshold
        self.startup_grace = startup_grace
        self.term = term
        self._key = control_key(key)
        self._estimator = BandwidthEstimator(rates)
        self._members: dict[int, Member] = {}
        self._sessions: dict[int, str | None] = {}  # None: presumed from a resume, not re-registered yet
        self._detectors: dict[int, PhiAccrualDetector] = {}
        self._awaiting_state: set[int] = set()  # joiners a donor was asked to send the state to
        self._last_reap = 0.0
        self._resumed = False
        self._size = world_size  # entries in the view: the highest rank ever seen + 1
        self._epoch = 0
        self._min_clock = 0
        self._max_clock = 0
        self._message_bytes: dict[int, float] = {}
        self._load: dict[int, dict[str, float]] = {}  # rank -> its latest reported load (LOAD)
        self._reach: dict[int, set[int]] = {}  # rank -> the ranks its multicast probe reached
        self._last_loss: float | None = None
        self._published: GlobalView | None = None
        self._view_version = 0
        self._view_from = 0
        self._fast_ticks_until = 0.0
        self._take_over: str | None = None  # a predecessor's endpoint to serve on too, once free
        self._take_over_until = 0.0
        self._next_take_over = 0.0
        self._next_tick = 0.0
        self.registrations = 0  # registrations served, ever
        self._most_members = 0  # the most members at once, ever
        self._most_planned = 0  # the most receivers a published view planned, ever
        # Requests refused as malformed, by type ("unknown": no such request); each was answered
        # with an error, or (a step_down whose successor did not confirm) logged.
        self.rejected: Counter[str] = Counter()
        self._successor_check: _SuccessorCheck | None = None  # a step_down's successor, asked to confirm
        self.moved_to: str | None = None  # set when a successor took over
        self._announce_end = False  # tell the clients that the job ended as it stops (``end``)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ctx = zmq.Context.instance()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._pub = self._ctx.socket(zmq.PUB)
        for sock in (self._router, self._pub):
            sock.setsockopt(zmq.LINGER, 0)
        p.encrypt_broadcasts(self._pub, key)  # anyone may subscribe: only key holders can read
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 0)
        # Requests are small; libzmq drops the connection of anyone sending more, before we see it.
        self._router.setsockopt(zmq.MAXMSGSIZE, p.MAX_REQUEST_BYTES)
        # A killed peer's connections close at once, and a stopped or lost one stops answering
        # ZeroMQ's own pings (answered by libzmq's threads, which a busy interpreter cannot stall):
        # a killed peer is known far sooner than from its heartbeats' silence, without the false
        # alarms of a peer whose interpreter is busy importing. The monitor reports each closed
        # connection by its file descriptor.
        set_transport_heartbeat(self._router, heartbeat)
        self._monitor = self._router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._connections: dict[int, int] = {}  # connection fd -> rank, from signed messages
        self.address = self._bind(self._router, bind, advertise)
        self.pub_address = self._bind(self._pub, _pub_endpoint(bind), advertise)
        self._thread = threading.Thread(target=self.serve, name="p2plearn-coordinator", daemon=True)

    @staticmethod
    def _bind(sock: zmq.Socket, bind: str, advertise: str | None) -> str:
        ep = p.endpoint(bind)
        if ep.startswith("tcp://") and ep.endswith(":0"):
            ep = ep[:-2] + ":*"
        sock.bind(ep)
        bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if bound.startswith("tcp://0.0.0.0:") or bound.startswith("tcp://*:"):
            bound = f"tcp://{advertise or '127.0.0.1'}:{bound.rsplit(':', 1)[1]}"
        return bound

    # -- lifecycle -------------------------------------------------------------------------

    def take_over(self, endpoint: str, within: float = 10.0) -> None:
        """Also serve on ``endpoint`` (the predecessor's) once it is free, trying for ``within`` s,
        if it is an address of this host: a peer restarted with the job's original address (rank 0
        after its host came back, say) then finds this coordinator there. Elsewhere it stays free."""
        self._take_over, self._take_over_until = p.endpoint(endpoint), time.monotonic() + within

    def start(self) -> Coordinator:
        """Serve on a thread of this process (``serve()`` serves on the caller's)."""
        self._thread.start()
        return self

    def end(self) -> None:
        """Stop serving at the end of the job: the clients are told (``ENDED``), and none of them
        looks for a successor (the server process ends its coordinator so)."""
        self._announce_end = True
        self.stop()

    def stop(self) -> None:
        """Stop serving, as a crash would: clients look for a successor once they suspect it
        (``end`` tells them the job ended instead)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        if self._router.closed:
            return
        self._router.disable_monitor()
        self._monitor.close()
        self._router.close()
        # A moment for ENDED to reach the subscribers (libzmq sends it on its own threads).
        self._pub.close(linger=ENDED_LINGER_MS)

    @property
    def serving(self) -> bool:
        return not self._stop.is_set()

    def __enter__(self) -> Coordinator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the launcher and tests read (thread-safe snapshots) ------------------------------

    @property
    def errors(self) -> int:
        """Requests refused as malformed (``rejected`` says which)."""
        return sum(self.rejected.values())

    def members(self) -> dict[int, Member]:
        with self._lock:
            return {r: Member(**m.to_dict()) for r, m in self._members.items()}

    def registered(self) -> int:
        """Members that registered here themselves; members presumed from a successor's hand-over
        (not re-registered yet) are not counted: once every peer that did has left, the job is over."""
        with self._lock:
            return sum(session is not None for session in self._sessions.values())

    def view(self) -> GlobalView:
        with self._lock:
            return self._view()

    def progress(self) -> Progress:
        with self._lock:
            return self._progress()

    # -- the loop ----------------------------------------------------------------------------

    def serve(self) -> None:
        """Serve until ``stop()`` or until a successor takes over."""
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        # Deaths are checked five times per heartbeat; requests are served for at most that long
        # between checks, so that a flood of heartbeats from many peers cannot starve the ticks.
        check = self.heartbeat / 5
        while not self._stop.is_set():
            if poller.poll(timeout=check * 1000):
                while self._monitor.poll(0):
                    event = recv_monitor_message(self._monitor)
                    with self._lock:
                        self._on_disconnect(int(event["value"]))
                until = time.monotonic() + check
                while self._router.poll(0) and time.monotonic() < until and not self._stop.is_set():
                    frames = self._router.recv_multipart(copy=False)
                    self._handle(frames[0].get(zmq.SRCFD), [f.bytes for f in frames])
            now = time.monotonic()
            if self._successor_check is not None:
                self._check_successor(now)
            if self._take_over and now >= self._next_take_over:
                self._try_take_over(now)
            with self._lock:
                # Heartbeats still queued (this process was itself descheduled on a busy host, say)
                # are not silence: judge once they are read, or after a period of backlog.
                if not self._router.poll(0) or now - self._last_reap > self.heartbeat:
                    self._last_reap = now
                    self._reap(now)
                if now >= self._next_tick:
                    self._publish(p.TICK, epoch=self._epoch, min_clock=self._min_clock, term=self.term,
                                  progress=self._progress().to_dict())
                    # Tick faster for a moment after a hello: a new client waits for its first tick
                    # to know that its subscription is live.
                    self._next_tick = now + (check if now < self._fast_ticks_until else self.heartbeat)
        if self.moved_to is None and self._announce_end:
            with self._lock:  # with the most members ever at once: a peer still starting knows the job ran
                self._publish(p.ENDED, term=self.term, most_members=self._most_members,
                              most_planned=self._most_planned)

    def _try_take_over(self, now: float) -> None:
        """Bind the predecessor's endpoint (on the serving thread: sockets are not thread-safe)."""
        try:
            self._router.bind(self._take_over)
            log.warning("serving also on %s, the endpoint of the coordinator this one succeeded", self._take_over)
            self._take_over = None
        except zmq.ZMQError as exc:
            # Still bound by a predecessor that is stepping down, or not an address of this host.
            if exc.errno == zmq.EADDRNOTAVAIL or now > self._take_over_until:
                self._take_over = None
            self._next_take_over = now + 0.5

    def _handle(self, fd: int, frames: list[bytes]) -> None:
        ident, msg = frames[0], frames[1:]
        try:
            body, blobs = p.unpack(self._key, self.job_id, msg)
        except p.AuthError as exc:
            self._router.send_multipart([ident, *p.refusal(str(exc), _untrusted_id(msg))])
            return
        kind = body.get("type")
        handler = getattr(self, f"_on_{kind}", None) if kind in REQUESTS else None
        with self._lock:
            try:
                if handler is None:
                    raise p.BadField(f"unknown request {str(kind)[:60]!r}")
                reply = handler(body, blobs)
                self._note_connection(fd, body)  # after the handler: a registration makes the member
            except Exception as exc:  # a key holder's bad request must never kill the loop: answer and count it
                self.rejected[kind if handler else "unknown"] += 1
                reply = {"type": p.ERROR, "reason": f"bad {str(kind)[:60]} request: {exc}"}
        if reply is not None:
            out_blobs = reply.pop("_blobs", None)
            self._router.send_multipart([ident, *p.pack(self._key, self.job_id, {**reply, "id": body.get("id")},
                                                        out_blobs)])

    def _note_connection(self, fd: int, body: dict) -> None:
        """Remember which member a connection belongs to (signed messages with its session only)."""
        rank = body.get("rank")
        if isinstance(rank, int) and rank in self._members and self._sessions.get(rank) == body.get("session"):
            self._connections[fd] = rank

    def _on_disconnect(self, fd: int) -> None:
        rank = self._connections.pop(fd, None)
        # A peer has two connections (requests, heartbeats): only the last one closing means its
        # process is gone.
        if rank is not None and rank in self._detectors and rank not in self._connections.values():
            self._detectors[rank].lost()

    def _publish(self, kind: str, blobs: list[bytes] | None = None, **body: Any) -> None:
        self._pub.send_multipart(p.pack(self._key, self.job_id, {"type": kind, **body}, blobs))

    # -- requests (called with the lock held) -----------------------------------------------------

    def _on_hello(self, body: dict, blobs: list[bytes]) -> dict:
        self._fast_ticks_until = time.monotonic() + 2 * self.heartbeat
        self._next_tick = 0.0
        return {"type": p.OK, "pub": self.pub_address, "heartbeat": self.heartbeat, "world_size": self.world_size,
                "term": self.term, "phi_threshold": self.phi_threshold, "startup_grace": self.startup_grace}

    def _on_register(self, body: dict, blobs: list[bytes]) -> dict:
        # Every field is checked before anything changes: a bad one refuses the whole request.
        rank, join, session = body.get("rank"), body.get("join") is True, p.text(body.get("session"), "session", 64)
        host, engine = p.text(body.get("host", ""), "host"), p.engine_address(body.get("engine"))
        standby = None if body.get("standby") is None else p.valid_endpoint(body["standby"], "standby")
        own_clock = p.integer(body.get("clock", 0), "clock")
        resume = _resume(body.get("resume"), blobs)
        if rank is None:
            if not join:
                return {"type": p.ERROR, "reason": "register needs a rank (only a joining peer may ask for one)"}
        elif _rank(rank) not in self._members and rank >= max(self._size, self.world_size) + RANK_HEADROOM:
            return {"type": p.ERROR, "reason": f"rank {rank} is far beyond the job's {self._size} ranks"}
        if resume and not self._resumed:
            self._adopt(*resume)
        if rank is None:
            rank = next(r for r in range(len(self._members) + 1) if r not in self._members)
        if rank in self._members and self._sessions[rank] not in (None, session):
            return {"type": p.ERROR, "reason": f"rank {rank} is already registered by another process"}
        self._estimator.seed_link(rank, _link_rate(body.get("link_rate")))  # sent with the engine's address
        known = self._members.get(rank)
        if known is not None and self._sessions[rank] is None and not resume:
            # Presumed from a hand-over, but this is a new process (restarted): the one presumed is gone.
            self._remove(rank, "dead")
            known = None
        donor = None
        resumed = resume[0]["clock"] if resume else None
        if known is None:
            # A process that registers a rank the job does not know once rounds have been made (a
            # restarted peer) holds no current model: like a joiner, it gets one from a donor.
            join = join or (resumed is None and self._max_clock > 0)
            if join:
                donor = self._donor(exclude=rank)
                if donor is not None and donor.clock <= own_clock:
                    donor = None  # it misses nothing (a false death at start-up, say): no state to send
                clock = donor.clock if donor else max(own_clock, self._min_clock)
            else:
                clock = resumed if resumed is not None else self._min_clock
            self._admit(Member(rank=rank, host=host, engine=engine, clock=clock, standby=standby), session, "join",
                        donor)
        else:
            self._sessions[rank] = session
            if resumed is not None and resumed < self._min_clock:
                # Behind every other member: a process restarted while the job failed over, which
                # registered at a stale coordinator and followed it here. Its model is not the job's.
                donor = self._donor(exclude=rank)
                # The presumed process's engine is gone (the new one registers its own): no state
                # may go there, so the donor learns of the change before it is asked to donate.
                known.engine = engine
                self._epoch += 1
                self._publish(p.MEMBER, event="update", epoch=self._epoch, member=known.to_dict())
            if donor is not None:
                known.clock = donor.clock
                self._awaiting_state.add(rank)
                self._publish(p.DONATE, to=donor.rank, rank=rank, engine=known.engine, clock=known.clock)
                self._advance_clock()
            elif resumed is not None:
                known.clock = max(known.clock, resumed)
                self._advance_clock()  # BSP peers far ahead wait on it, and report no round meanwhile
            if (engine and engine != known.engine) or (standby and standby != known.standby):
                if engine and engine != known.engine:
                    self._forget_reach(rank)  # the others' probes reached its old engine
                known.engine = engine or known.engine
                known.standby = standby or known.standby
                self._epoch += 1
                self._publish(p.MEMBER, event="update", epoch=self._epoch, member=known.to_dict())
                self._publish_view()  # after the member: whoever plans with it knows where it receives
        self._detectors[rank].heartbeat()
        self.registrations += 1
        header, view_blobs = self._view().to_blobs()
        return {"type": p.OK, "rank": rank, "clock": self._members[rank].clock, **self._snapshot(),
                "donor": donor.to_dict() if donor else None, "view": header, "_blobs": view_blobs}

    def _admit(self, member: Member, session: str | None, event: str, donor: Member | None) -> None:
        """Add ``member``; with a donor, ask it to send the member the model state."""
        rank = member.rank
        self._members[rank] = member
        self._sessions[rank] = session
        self._most_members = max(self._most_members, len(self._members))
        # In its grace period until it reports a round: its first imports may stall it for seconds.
        self._detectors[rank] = PhiAccrualDetector(self.heartbeat, threshold=self.phi_threshold,
                                                   acceptable_pause=self._acceptable_pause(),
                                                   grace=self.startup_grace, warmup=None)
        self._size = max(self._size, rank + 1)
        self._epoch += 1
        self._publish(p.MEMBER, event=event, epoch=self._epoch, member=member.to_dict())
        if donor is not None:
            self._awaiting_state.add(rank)
            self._publish(p.DONATE, to=donor.rank, rank=rank, engine=member.engine, clock=member.clock)
        # The slowest clock includes it now: alone in the job, it would otherwise wait on the clock
        # of members gone before it came (no one reports a round to move it).
        if not self._advance_clock():
            self._publish_view()

    def _donor(self, exclude: int) -> Member | None:
        """The most advanced live peer (lowest rank on ties), preferring one that holds its state
        now to a joiner still waiting for its own (which would pass it on only once it has it)."""
        candidates = (m for m in self._members.values() if m.rank != exclude)
        return max(candidates, key=lambda m: (m.rank not in self._awaiting_state, m.clock, -m.rank), default=None)

    def _adopt(self, resume: dict, members: list[Member], view: GlobalView | None) -> None:
        """A successor's first re-registration: the membership and the view its sender held
        (checked by ``_resume``)."""
        self._resumed = True
        if view is not None:
            self._estimator.seed({name: getattr(view, name) for name in
                                  ("uplink", "downlink", "uplink_target", "downlink_target")})
            self._size = max(self._size, view.size)
            self._message_bytes.update({r: float(b) for r, b in enumerate(view.message_bytes) if b > 0})
            self._reach = reach_of(view.mcast_domain)  # until peers report again: what the domains say
        for member in members:
            if member.rank not in self._members:
                if view is not None and member.rank < view.size:
                    member.clock = max(member.clock, int(view.clock[member.rank]))  # members' clocks go stale
                self._members[member.rank] = member
                self._sessions[member.rank] = None
                # The others re-register as soon as they notice the failover; one still starting
                # (clock 0: importing torch, say) may not look for seconds.
                grace = self.startup_grace if member.clock == 0 else max(3.0, 6 * self.heartbeat)
                detector = PhiAccrualDetector(self.heartbeat, threshold=self.phi_threshold,
                                              acceptable_pause=self._acceptable_pause(), grace=grace, warmup=None)
                self._detectors[member.rank] = detector
                self._size = max(self._size, member.rank + 1)
        self._epoch = max(self._epoch, resume["epoch"]) + 1
        self._max_clock = max((m.clock for m in self._members.values()), default=0)
        self._min_clock = min((m.clock for m in self._members.values()), default=0)
        self._publish_view()

    def _on_heartbeat(self, body: dict, blobs: list[bytes]) -> dict | None:
        rank, session = _rank(body["rank"]), body.get("session")
        if rank in self._members and self._sessions.get(rank) == session:
            self._detectors[rank].heartbeat()
            return None
        # Declared dead (or unknown to this coordinator): the client re-registers as a joiner, so
        # that a donor sends it the state it missed.
        return {"type": p.ERROR, "reason": "expelled", "expelled": True}

    def _on_report(self, body: dict, blobs: list[bytes]) -> dict | None:
        clock, loss = p.integer(body.get("clock"), "clock"), p.loss_value(body.get("loss"))
        step_time, size = (None if body.get(name) is None else p.number(body[name], name)
                           for name in ("step_time", "message_bytes"))
        links = _links(body.get("links"))
        reply = self._on_heartbeat(body, blobs)
        if reply is not None:
            return reply
        rank = _rank(body["rank"])
        member = self._members[rank]
        self._detectors[rank].end_warmup()  # it is training: its heartbeats now come in rhythm
        self._awaiting_state.discard(rank)  # it reports rounds only once it holds a state
        member.clock = max(member.clock, clock)
        self._max_clock = max(self._max_clock, member.clock)
        if loss is not None:
            member.loss = self._last_loss = loss
        if step_time is not None:
            member.step_time = step_time
        if size:
            self._message_bytes[rank] = size
        self._estimator.observe(member.rank, clock, links)
        self._load[rank] = _load(body.get("load"))
        self._advance_clock()
        return None

    def _on_state(self, body: dict, blobs: list[bytes]) -> dict:
        """A joiner whose state did not come (its donor died, or the state went to an address
        the donor had not yet learned was gone): ask a donor again."""
        rank = _rank(body["rank"])
        if rank not in self._members or self._sessions.get(rank) != body.get("session"):
            return {"type": p.ERROR, "reason": "expelled", "expelled": True}
        member = self._members[rank]
        donor = self._donor(exclude=rank)
        if donor is not None:
            member.clock = max(member.clock, donor.clock)
            self._awaiting_state.add(rank)
            self._publish(p.DONATE, to=donor.rank, rank=rank, engine=member.engine, clock=member.clock)
            self._advance_clock()
        return {"type": p.OK, "donor": donor.to_dict() if donor else None}

    def _on_reach(self, body: dict, blobs: list[bytes]) -> dict:
        """Which ranks a member's multicast probe reached; the view's ``mcast_domain`` follows
        (``domains_from_reach``). Ranks that are no longer members are left out (they died since)."""
        rank = _rank(body["rank"])
        if rank not in self._members or self._sessions.get(rank) != body.get("session"):
            return {"type": p.ERROR, "reason": "expelled", "expelled": True}
        reached = body.get("reached")
        if not isinstance(reached, list) or not all(isinstance(j, int) and not isinstance(j, bool) for j in reached):
            raise TypeError(f"reached must be a list of ranks, got {str(reached)[:100]}")
        out = [j for j in reached if not 0 <= j < self._size]
        if out:
            raise ValueError(f"reached ranks {out[:10]} are out of range (the job has ranks 0..{self._size - 1})")
        self._reach[rank] = {j for j in reached if j in self._members and j != rank}
        self._publish_view()
        return {"type": p.OK}

    def _forget_reach(self, rank: int) -> None:
        """``rank`` is gone or moved its engine: nobody's probe has reached it since."""
        self._reach.pop(rank, None)
        for reached in self._reach.values():
            reached.discard(rank)

    def _on_members(self, body: dict, blobs: list[bytes]) -> dict:
        return {"type": p.OK, **self._snapshot()}

    def _on_view(self, body: dict, blobs: list[bytes]) -> dict:
        header, out = self._view().to_blobs()
        return {"type": p.OK, "view": header, "_blobs": out}

    def _on_leave(self, body: dict, blobs: list[bytes]) -> dict:
        rank = _rank(body["rank"])
        if rank in self._members and self._sessions.get(rank) == body.get("session"):
            self._remove(rank, "leave")
        return {"type": p.OK}

    def _on_step_down(self, body: dict, blobs: list[bytes]) -> dict:
        """A successor of a later term says it started: ask it (a signed hello); once it answers
        with that term (``_check_successor``), send every client there and stop serving. A name
        that does not answer so (a bogus address, a stale term) costs nothing but the question."""
        term, endpoint = p.integer(body.get("term"), "term"), p.valid_endpoint(body.get("endpoint"), "endpoint")
        if term <= self.term:
            return {"type": p.ERROR, "reason": f"term {term} is not after this coordinator's {self.term}"}
        if self._successor_check is not None:
            return {"type": p.ERROR, "reason": f"already asking the successor at {self._successor_check.endpoint}"}
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)  # checked: a valid endpoint (the connection itself is made in the background)
        sock.send_multipart(p.pack(self._key, self.job_id, {"type": p.HELLO, "id": term, "session": "step-down"}),
                            flags=zmq.NOBLOCK)
        self._successor_check = _SuccessorCheck(sock, term, endpoint, time.monotonic() + SUCCESSOR_CHECK_S)
        return {"type": p.OK}

    def _check_successor(self, now: float) -> None:
        """Step down once the successor named by a step_down answered with its term (serving
        thread); forget it if it has not within SUCCESSOR_CHECK_S."""
        check = self._successor_check
        confirmed = False
        while not confirmed and check.sock.poll(0):
            try:
                reply, _ = p.unpack(self._key, self.job_id, check.sock.recv_multipart())
            except p.AuthError:
                continue
            confirmed = reply.get("type") == p.OK and reply.get("term") == check.term and reply.get("id") == check.term
        if not confirmed and now < check.deadline:
            return
        check.sock.close()
        self._successor_check = None
        if not confirmed:
            self.rejected[p.STEP_DOWN] += 1
            log.warning("a step_down named a successor at %s (term %d) that did not answer: still serving",
                        check.endpoint, check.term)
            return
        with self._lock:
            self.moved_to = check.endpoint
            self._publish(p.MOVED, endpoint=check.endpoint, term=check.term)
        self._stop.set()

    # -- membership, clocks and the view (lock held) -----------------------------------------------

    def _snapshot(self) -> dict:
        """The membership, and the most members (and receivers a view planned) ever at once: a peer
        that missed the joins of peers that came and left tells from these that the job started."""
        return {"members": [m.to_dict() for m in self._members.values()], "epoch": self._epoch,
                "min_clock": self._min_clock, "most_members": self._most_members, "most_planned": self._most_planned}

    def _progress(self) -> Progress:
        ms = list(self._members.values())
        losses = [m.loss for m in ms if m.loss is not None]
        slowest = min(ms, key=lambda m: (m.clock, -(m.step_time or 0.0)), default=None)
        return Progress(min_clock=self._min_clock, max_clock=self._max_clock, alive=len(ms),
                        loss=float(np.mean(losses)) if losses else self._last_loss,
                        slowest=slowest.rank if slowest else None)

    def _view(self) -> GlobalView:
        alive = np.zeros(self._size, dtype=bool)
        clock = np.zeros(self._size, dtype=np.int64)
        for r, m in self._members.items():
            # Planned as a receiver only once its engine is known: before that, a peer that knew
            # the member but not its engine would skip it while the member waited for its message.
            alive[r], clock[r] = m.engine is not None, m.clock
        sizes = np.array([self._message_bytes.get(r, 0.0) for r in range(self._size)])
        load = {name: np.array([self._load.get(r, {}).get(name, 0.0) for r in range(self._size)]) for name in LOAD}
        reach = {r: self._reach[r] for r in self._members if r in self._reach}
        return GlobalView(round=self._min_clock, alive=alive, clock=clock, message_bytes=sizes,
                          mcast_domain=domains_from_reach(reach, self._size), term=self.term,
                          version=self._view_version, from_round=self._view_from,
                          **self._estimator.arrays(self._size), **load)

    def _publish_view(self) -> None:
        """Push the view; a new version when a planning input changed materially (``plans_like``),
        applying from a round the fastest peer has not planned yet (before the first round: from
        round 0, unless a peer reported its multicast reach: it starts its rounds right after, while
        others may still be probing); else the published version with its planning inputs, and what
        else is new."""
        view = self._view()
        if view.plans_like(self._published):
            view = replace(view, **{name: getattr(self._published, name) for name in PLANNING_INPUTS})
        else:
            self._view_version += 1
            self._view_from = self._max_clock + VIEW_LEAD if self._max_clock or self._reach else 0
            view = self._view()
        self._published = view
        self._most_planned = max(self._most_planned, int(view.alive.sum()))
        header, blobs = view.to_blobs()
        self._publish(p.VIEW, view=header, blobs=blobs)

    def _acceptable_pause(self) -> float:
        """Silence always forgiven a peer: its heartbeat thread waits for the interpreter lock
        behind the training loop, and on a busy host for a core."""
        return max(1.0, 2 * self.heartbeat)

    def _reap(self, now: float) -> None:
        for rank in [r for r, d in self._detectors.items() if d.suspected(now)]:
            d = self._detectors[rank]
            log.warning("rank %d declared dead: silent for %.2f s (%s)", rank, now - d.last, d.verdict(now))
            self._remove(rank, "dead")

    def _remove(self, rank: int, event: str) -> None:
        member = self._members.pop(rank)
        del self._sessions[rank], self._detectors[rank]
        self._awaiting_state.discard(rank)
        self._connections = {i: r for i, r in self._connections.items() if r != rank}
        self._load.pop(rank, None)  # what it computed and received no longer loads anyone
        self._forget_reach(rank)
        self._epoch += 1
        self._publish(p.MEMBER, event=event, epoch=self._epoch, member=member.to_dict())
        if not self._advance_clock():
            self._publish_view()

    def _advance_clock(self) -> bool:
        """Publish the slowest live clock when it moves, and with it the view (once per completed
        round); True if it moved."""
        # A joiner waiting for its state reports no round until it has one, and gets one from a
        # donor's next step: were it the slowest, a donor could wait on it (BSP's lead bound) for
        # the cap before sending it anything.
        low = min((m.clock for m in self._members.values() if m.rank not in self._awaiting_state),
                  default=self._min_clock)
        if low == self._min_clock:
            return False
        self._min_clock = low
        self._estimator.close_round(low)
        self._publish(p.CLOCK, min_clock=low)
        self._publish_view()
        return True


def set_transport_heartbeat(sock: zmq.Socket, heartbeat: float) -> None:
    """ZeroMQ-level pings every ``heartbeat`` s; a connection silent for 10 of them (at least 5 s)
    is closed, which the socket's monitor reports. libzmq's I/O thread answers pings without the
    interpreter lock, so only a stopped process or a lost host goes that long; the phi detectors
    judge shorter stalls."""
    silent = int(max(5.0, 10 * heartbeat) * 1000)
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(heartbeat * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, silent)
    sock.setsockopt(zmq.HEARTBEAT_TTL, silent)


def _rank(value: Any) -> int:
    return p.integer(value, "rank", 0, p.MAX_RANK)


@dataclass
class _SuccessorCheck:
    """A successor named by a step_down, asked (a signed hello on ``sock``) to confirm its term."""

    sock: zmq.Socket
    term: int
    endpoint: str
    deadline: float


def _resume(value: Any, blobs: list[bytes]) -> tuple[dict[str, int], list[Member], GlobalView | None] | None:
    """A re-registration's hand-over (``Client._resume``), checked whole before any of it is used:
    its clock and epoch, the members and the view its sender held. None: no hand-over."""
    if not value:
        return None
    if not isinstance(value, dict):
        raise p.BadField(f"resume must be an object, got {str(value)[:60]}")
    members = value.get("members", [])
    if not isinstance(members, list) or len(members) > p.MAX_RANK:
        raise p.BadField("resume members must be a list of members")
    view = GlobalView.from_blobs(value["view"], blobs) if value.get("view") else None
    counts = {name: p.integer(value.get(name, 0), f"resume {name}") for name in ("clock", "epoch")}
    return counts, [Member.from_dict(d) for d in members], view


def _links(value: Any) -> dict[int, dict[str, Any]]:
    """A report's ``links`` (see ``Client.report``): the flows whose receiver is a rank and whose
    ``rate`` and ``paced`` are numbers in [0, MAX_RATE); any other flow says nothing and is left
    out, as ``_load`` leaves out a load it cannot use (the report's clock still counts)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise p.BadField("links must be an object")
    links = {}
    for receiver, flow in value.items():
        if not (receiver.isascii() and receiver.isdigit() and int(receiver) < p.MAX_RANK and isinstance(flow, dict)):
            continue
        rate, paced = flow.get("rate", 0.0), flow.get("paced", 0.0)
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < p.MAX_RATE for x in (rate, paced)):
            probe = str(flow.get("probe", ""))[:32]
            links[int(receiver)] = {"rate": float(rate), "paced": float(paced), "probe": probe,
                                    "multicast": flow.get("multicast") is True}
    return links


def _load(value: Any) -> dict[str, float]:
    """A peer's reported load: the LOAD entries that are finite numbers >= 0 (else 0: nothing known),
    those below their unit's floor (``view.FLOOR``) as 0. Below it a load is noise, and noise that
    enters a plan is read as a difference: a peer whose published merge time was 0.5 ms, the others'
    0 (a new view takes everyone's current load, a load changing by less than the floor makes none),
    could merge no message by a T of microseconds, and SELMCAST left it without senders for good."""
    out = {}
    for name in LOAD:
        try:
            x = float((value or {}).get(name, 0.0))
        except (TypeError, ValueError, AttributeError, OverflowError):
            x = 0.0
        out[name] = x if FLOOR.get(name, 0.0) <= x < float("inf") else 0.0
    return out


def _link_rate(value: Any) -> float | None:
    """A registering peer's interface rate: bytes/s if a positive finite number (< 100 Tbit/s), else unknown."""
    try:
        rate = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return rate if 0 < rate < p.MAX_RATE else None


def _pub_endpoint(bind: str) -> str:
    """The PUB socket's endpoint: same host on a free port, or a sibling ipc path."""
    ep = p.endpoint(bind)
    if ep.startswith("ipc://"):
        return ep + ".pub"
    return ep.rsplit(":", 1)[0] + ":0"


def _untrusted_id(msg: list[bytes]) -> Any:
    """The request id of a refused message, so that its sender can match the refusal."""
    try:
        return json.loads(msg[0]).get("id")
    except (ValueError, AttributeError, IndexError, RecursionError):
        return None
