"""The coordinator: the control plane's server of one job, a socket shell around its soft state.

It serves two ZeroMQ sockets: a ROUTER for requests and heartbeats, and a PUB that pushes events
(joins, deaths, the slowest clock, each new version of the global view, and a tick every heartbeat
with the job's progress so that clients can tell that it is alive). Nothing here carries tensors,
and no training step waits on it: peers plan their rounds from the view they hold. What it knows
(membership, failure detection, clock table, global view) and every rule it applies are the
``MembershipTable``'s: the coordinator receives a request, checks its fields, calls the table,
publishes the events the table returns, then replies.

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
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..keys import control_key
from . import protocol as p
from .fields import read_counts, read_link_rate, read_links, read_load, read_rank, read_resume
from .membership import Member
from .progress import Progress
from .table import MembershipTable, Publication
from .view import GlobalView

log = logging.getLogger("p2plearn.control")

REQUESTS = (p.HELLO, p.REGISTER, p.HEARTBEAT, p.REPORT, p.MEMBERS, p.VIEW, p.LEAVE, p.STEP_DOWN, p.STATE, p.REACH)
SUCCESSOR_CHECK_S = 5.0  # how long a successor named by a step_down has to answer, signed, with its term
ENDED_LINGER_MS = 500  # how long a stopped coordinator's PUB socket may take to deliver ENDED


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
        self._table = MembershipTable(world_size, heartbeat_interval=heartbeat, phi_threshold=phi_threshold,
                                      startup_grace=startup_grace, rates=rates, term=term)  # under _lock
        self._last_reap = 0.0
        self._fast_ticks_until = 0.0
        self._take_over: str | None = None  # a predecessor's endpoint to serve on too, once free
        self._take_over_until = 0.0
        self._next_take_over = 0.0
        self._next_tick = 0.0
        # Requests refused as malformed, by type ("unknown": no such request); each was answered
        # with an error, or (a step_down whose successor did not confirm) logged.
        self.rejected: Counter[str] = Counter()
        self._successor_check: _SuccessorCheck | None = None  # a step_down's successor, asked to confirm
        self.moved_to: str | None = None  # set when a successor took over
        self._announce_end = False  # tell the clients that the job ended as it stops (``end``)
        # A monitor (``p2plearn.monitor``: its JobRecord, its plan log), fed on the serving thread with
        # the lock held: every broadcast, every report, and the table's snapshot every tick. Set before
        # start(); None: none.
        self.watcher: Any = None
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
        p.set_transport_heartbeat(self._router, heartbeat)
        self._monitor = self._router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
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

    @property
    def registrations(self) -> int:
        """Registrations served, ever."""
        return self._table.registrations

    def members(self) -> dict[int, Member]:
        with self._lock:
            return self._table.members()

    def registered(self) -> int:
        """Members that registered here themselves (``MembershipTable.registered``)."""
        with self._lock:
            return self._table.registered()

    def view(self) -> GlobalView:
        with self._lock:
            return self._table.view()

    def progress(self) -> Progress:
        with self._lock:
            return self._table.progress()

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
                        self._table.disconnected(int(event["value"]))
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
                    self._publish(*self._table.reap(now))
                if now >= self._next_tick:
                    self._publish(self._table.tick())
                    if self.watcher is not None:
                        self.watcher.observe(self._table.watch(now))
                    # Tick faster for a moment after a hello: a new client waits for its first tick
                    # to know that its subscription is live.
                    self._next_tick = now + (check if now < self._fast_ticks_until else self.heartbeat)
        if self.moved_to is None and self._announce_end:
            with self._lock:
                self._publish(self._table.ended())

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
                # After the handler: a registration makes the member.
                self._table.note_connection(fd, body.get("rank"), body.get("session"))
            except Exception as exc:  # a key holder's bad request must never kill the loop: answer and count it
                self.rejected[kind if handler else "unknown"] += 1
                reply = {"type": p.ERROR, "reason": f"bad {str(kind)[:60]} request: {exc}"}
        if reply is not None:
            out_blobs = reply.pop("_blobs", None)
            self._router.send_multipart([ident, *p.pack(self._key, self.job_id, {**reply, "id": body.get("id")},
                                                        out_blobs)])

    def _publish(self, *publications: Publication) -> None:
        """Broadcast, in order (serving thread, lock held: the table's changes go out as made)."""
        for publication in publications:
            if self.watcher is not None:
                self.watcher.published(publication)
            self._pub.send_multipart(p.pack(self._key, self.job_id, {"type": publication.kind, **publication.body},
                                            publication.blobs))

    # -- requests (called with the lock held): their fields checked, then the table's rules ----------

    def _on_hello(self, body: dict, blobs: list[bytes]) -> dict:
        self._fast_ticks_until = time.monotonic() + 2 * self.heartbeat
        self._next_tick = 0.0
        return {"type": p.OK, "pub": self.pub_address, "heartbeat": self.heartbeat, "world_size": self.world_size,
                "term": self.term, "phi_threshold": self.phi_threshold, "startup_grace": self.startup_grace}

    def _on_register(self, body: dict, blobs: list[bytes]) -> dict:
        # Every field is checked before anything changes: a bad one refuses the whole request.
        session = p.text(body.get("session"), "session", 64)
        host, engine = p.text(body.get("host", ""), "host"), p.engine_address(body.get("engine"))
        standby = None if body.get("standby") is None else p.valid_endpoint(body["standby"], "standby")
        clock = p.integer(body.get("clock", 0), "clock")
        resume = read_resume(body.get("resume"), blobs)
        rank = None if body.get("rank") is None else read_rank(body["rank"])
        reply, publications = self._table.register(
            rank, session, join=body.get("join") is True, host=host, engine=engine, standby=standby, clock=clock,
            resume=resume, link_rate=read_link_rate(body.get("link_rate")))
        self._publish(*publications)
        return reply

    def _on_heartbeat(self, body: dict, blobs: list[bytes]) -> dict | None:
        return self._table.heartbeat(read_rank(body["rank"]), body.get("session"))

    def _on_report(self, body: dict, blobs: list[bytes]) -> dict | None:
        clock, loss = p.integer(body.get("clock"), "clock"), p.loss_value(body.get("loss"))
        step_time, size = (None if body.get(name) is None else p.number(body[name], name)
                           for name in ("step_time", "message_bytes"))
        links, load, rank = read_links(body.get("links")), read_load(body.get("load")), read_rank(body["rank"])
        reply, publications = self._table.report(rank, body.get("session"), clock=clock, loss=loss, step_time=step_time,
                                                 message_bytes=size, links=links, load=load)
        if reply is None and self.watcher is not None:  # a member's round
            self.watcher.reported(rank, clock, step_time, load, read_counts(body.get("counts")))
        self._publish(*publications)
        return reply

    def _on_state(self, body: dict, blobs: list[bytes]) -> dict:
        reply, publications = self._table.state(read_rank(body["rank"]), body.get("session"))
        self._publish(*publications)
        return reply

    def _on_reach(self, body: dict, blobs: list[bytes]) -> dict:
        reply, publications = self._table.reach(read_rank(body["rank"]), body.get("session"), body.get("reached"))
        self._publish(*publications)
        return reply

    def _on_members(self, body: dict, blobs: list[bytes]) -> dict:
        return {"type": p.OK, **self._table.snapshot()}

    def _on_view(self, body: dict, blobs: list[bytes]) -> dict:
        header, out = self._table.view().to_blobs()
        return {"type": p.OK, "view": header, "_blobs": out}

    def _on_leave(self, body: dict, blobs: list[bytes]) -> dict:
        self._publish(*self._table.leave(read_rank(body["rank"]), body.get("session")))
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
            self._publish(Publication(p.MOVED, {"endpoint": check.endpoint, "term": check.term}))
        self._stop.set()


@dataclass
class _SuccessorCheck:
    """A successor named by a step_down, asked (a signed hello on ``sock``) to confirm its term."""

    sock: zmq.Socket
    term: int
    endpoint: str
    deadline: float


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
