"""A key holder's messages, whatever their fields, are decoded totally: a bad one is refused and
counted, and the coordinator and the clients keep serving (property-based, with Hypothesis)."""

import itertools
import queue
import socket
import threading
import time

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from control_helpers import JOB, wait_event
from p2plearn.control import Client, ControlError, Coordinator
from p2plearn.control import coordinator as coordinator_module
from p2plearn.control import protocol as p
from p2plearn.control.listener import MESSAGES
from p2plearn.control.coordinator import REQUESTS
from p2plearn.control.view import _ARRAYS, GlobalView
from p2plearn.keys import control_key

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _view_blobs(size: int = 2) -> tuple[dict, list[bytes]]:
    arrays = {name: np.zeros(size) for name in _ARRAYS}
    arrays.update(alive=np.ones(size, dtype=bool), clock=np.zeros(size, dtype=np.int64),
                  mcast_domain=np.full(size, -1, dtype=np.int64))
    return GlobalView(round=0, **arrays).to_blobs()


# Any JSON value, and for each field values close to valid ones (those reach deeper into a handler).
ANY = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
                   lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                   max_leaves=8)
RANK = st.integers(-2, 8) | st.sampled_from([2**20, 2**62, 2**64])
ENDPOINT = st.sampled_from(["tcp://127.0.0.1:1", "tcp://:5", "ipc://", "tcp://h:\u00b2", "tcp://127.0.0.1:99999",
                            "tcp://h:0", "udp://127.0.0.1:5", "tcp://127.0.0.1", "tcp://a b:5"]) | st.builds(
    lambda port: f"tcp://127.0.0.1:{port}", st.just(0).map(lambda _: _closed_port()))
ENGINE = st.tuples(st.sampled_from(["127.0.0.1", "", 5]), st.integers(-1, 70000)).map(list)
MEMBER = st.fixed_dictionaries({"rank": RANK, "host": st.text(max_size=4)},
                               optional={"engine": ENGINE | ANY, "clock": RANK | ANY, "loss": ANY,
                                         "step_time": ANY, "standby": ENDPOINT | ANY})
NUMBER = st.floats() | st.integers(-(2**64), 2**64)
FIELDS = {
    "rank": RANK | ANY, "session": st.text(max_size=40) | ANY, "host": st.text(max_size=300) | ANY,
    "engine": ENGINE | ANY, "standby": ENDPOINT | ANY, "join": st.booleans() | ANY, "clock": RANK | NUMBER | ANY,
    "link_rate": NUMBER | ANY, "loss": NUMBER | ANY, "step_time": NUMBER | ANY, "message_bytes": NUMBER | ANY,
    "load": st.dictionaries(st.sampled_from(["compute_s", "backlog", "x"]), NUMBER | ANY) | ANY,
    "links": st.dictionaries(st.sampled_from(["1", "-1", "x", "99999999"]), st.fixed_dictionaries(
        {}, optional={"rate": NUMBER | ANY, "paced": NUMBER | ANY, "probe": ANY, "multicast": ANY})) | ANY,
    "reached": st.lists(RANK, max_size=4) | ANY, "term": RANK | ANY, "endpoint": ENDPOINT | ANY,
    "resume": st.fixed_dictionaries({}, optional={"clock": RANK | ANY, "epoch": RANK | ANY, "members": st.lists(
        MEMBER | ANY, max_size=3) | ANY, "view": st.just({"round": 0, "size": 2}) | ANY}) | ANY,
    "epoch": RANK | ANY, "min_clock": RANK | ANY, "member": MEMBER | ANY, "event": st.sampled_from(
        ["join", "update", "leave", "dead", "zap"]) | ANY, "members": st.lists(MEMBER | ANY, max_size=3) | ANY,
    "view": st.just({"round": 0, "size": 2}) | st.fixed_dictionaries(
        {"round": RANK, "size": st.integers(-1, 3)}) | ANY, "to": RANK | ANY, "id": RANK | ANY,
    "progress": st.fixed_dictionaries({}, optional={k: RANK | NUMBER | ANY for k in (
        "min_clock", "max_clock", "alive", "loss", "slowest", "extra")}) | ANY,
    "expelled": st.booleans() | ANY, "most_members": RANK | ANY, "most_planned": RANK | ANY,
}
# The fields each message type reads: always sent (any other field may come too).
REQUEST_FIELDS = {
    p.HELLO: (), p.MEMBERS: (), p.VIEW: (), p.HEARTBEAT: ("rank", "session"), p.LEAVE: ("rank", "session"),
    p.STATE: ("rank", "session"), p.REACH: ("rank", "session", "reached"), p.STEP_DOWN: ("term", "endpoint"),
    p.REGISTER: ("rank", "session", "host", "engine", "standby", "join", "clock", "link_rate", "resume"),
    p.REPORT: ("rank", "session", "clock", "loss", "step_time", "message_bytes", "load", "links"), "bogus": ()}
EVENT_FIELDS = {
    p.TICK: ("epoch", "min_clock", "term", "progress"), p.MEMBER: ("event", "epoch", "member"),
    p.CLOCK: ("min_clock",), p.VIEW: ("view",), p.DONATE: ("to", "rank", "engine", "clock"),
    p.MOVED: ("endpoint", "term"), p.ENDED: ("term",), p.ERROR: ("expelled", "id"),
    p.OK: ("members", "epoch", "min_clock", "most_members", "most_planned"), "bogus": ()}
BLOBS = st.just(_view_blobs()[1]) | st.lists(st.binary(max_size=40), max_size=18) | st.just(
    [b"\xff" * 16] * len(_ARRAYS))


def _messages(fields_of, session=None):
    """(body, blobs): a message of each type with the fields it reads, near-valid or anything, and
    perhaps others; ``session``: a real member's, so that its requests reach past the session check."""
    fields = {**FIELDS, "session": st.just(session) | FIELDS["session"]} if session else FIELDS

    def of_type(kind):
        return st.fixed_dictionaries({"type": st.just(kind), **{f: fields[f] for f in fields_of[kind]}},
                                     optional={f: v for f, v in fields.items() if f not in fields_of[kind]})

    return st.tuples(st.sampled_from(sorted(fields_of)).flatmap(of_type), BLOBS)


def test_the_fuzzing_covers_every_message_type():
    assert set(REQUEST_FIELDS) == {*REQUESTS, "bogus"} and set(EVENT_FIELDS) == {*MESSAGES, "bogus"}


def _replies(sock, until_id, timeout=10.0):
    """Read sock's replies until the one with id ``until_id``."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        assert sock.poll(left * 1000), "the coordinator stopped answering"
        frames = sock.recv_multipart()
        if p.parse_refusal(frames) is None and p.unpack(control_key(KEY), JOB, frames)[0].get("id") == until_id:
            return
    raise AssertionError("the coordinator stopped answering")


KEY = "5e" * 32


def test_every_request_from_a_key_holder_leaves_the_coordinator_serving():
    coord = Coordinator(JOB, KEY, world_size=2, heartbeat=0.2).start()
    member = Client(coord.address, JOB, KEY, rank=0, connect_timeout=5.0)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(coord.address)
    probes = itertools.count(10**6)
    try:
        member.register(("127.0.0.1", 9000))

        @FUZZ
        @given(_messages(REQUEST_FIELDS, session=member._session))
        def check(message):
            body, blobs = message
            sock.send_multipart(p.pack(control_key(KEY), JOB, body, blobs))
            probe = next(probes)
            sock.send_multipart(p.pack(control_key(KEY), JOB, {"type": p.HELLO, "id": probe}))
            _replies(sock, probe)  # served in order: everything sent before was handled
            assert coord.serving and coord._thread.is_alive()
            coord.progress(), coord.view().to_blobs()  # nothing it holds is unusable

        check()
        time.sleep(0.5)  # ticks, reaps and views after the last one
        assert coord.serving and coord._thread.is_alive()
        assert coord.errors > 0  # the malformed ones were counted
        member.fetch_view()
        newcomer = Client(coord.address, JOB, KEY, rank=None, connect_timeout=5.0)
        try:
            newcomer.register(("127.0.0.1", 9100), join=True)  # still serving: a newcomer joins
        finally:
            newcomer.close()
    finally:
        sock.close()
        member.close()
        coord.stop()


def test_a_signed_step_down_naming_no_successor_leaves_the_coordinator_serving(coordinator, connect, key,
                                                                                 monkeypatch):
    """A key holder's step_down naming an address where no successor answers (it once stopped the
    coordinator, and sent every client there)."""
    monkeypatch.setattr(coordinator_module, "SUCCESSOR_CHECK_S", 0.5)
    client = connect(0)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(coordinator.address)
    try:
        nobody = f"tcp://127.0.0.1:{_closed_port()}"
        for i, endpoint in enumerate([nobody, "no endpoint", nobody]):
            sock.send_multipart(p.pack(control_key(key), JOB, {"type": p.STEP_DOWN, "term": 1, "endpoint": endpoint,
                                                               "id": i}))
            assert sock.poll(5000)
            time.sleep(1.0)  # past the successor's time to answer
            assert coordinator.serving and coordinator.moved_to is None
        assert coordinator.rejected[p.STEP_DOWN] == 3
        assert wait_event(client, "coordinator_moved", timeout=0.5) is None
        client.fetch_view()
    finally:
        sock.close()


def test_a_step_down_naming_a_live_successor_moves_the_clients(coordinator, connect, key):
    successor = Coordinator(JOB, key, world_size=3, term=1).start()
    client = connect(0, ("127.0.0.1", 9000))
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(coordinator.address)
    try:
        sock.send_multipart(p.pack(control_key(key), JOB, {"type": p.STEP_DOWN, "term": 1,
                                                           "endpoint": successor.address, "id": 0}))
        moved = wait_event(client, "coordinator_moved", timeout=20)
        assert moved is not None and moved.endpoint == successor.address
        assert coordinator.moved_to == successor.address and not coordinator.serving
        assert sorted(successor.members()) == [0]
    finally:
        sock.close()
        client.close()
        successor.stop()


class FakeCoordinator:
    """What a key holder running a coordinator can send a client: a ROUTER that answers hello
    (``hello`` overrides its fields; a 5 s heartbeat, so that the client suspects nothing while it
    is fuzzed) and register, and a PUB, served on a thread of their own; ``send(frames, to_router)``
    queues a message (PUB, or the ROUTER to the client's heartbeat connection)."""

    def __init__(self, key: str, hello: dict | None = None) -> None:
        ctx = zmq.Context.instance()
        self.router, self.pub = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PUB)
        p.encrypt_broadcasts(self.pub, key)
        for sock in (self.router, self.pub):
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind("tcp://127.0.0.1:*")
        self.address = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._key = control_key(key)
        self._hello = {"type": p.OK, "pub": self.pub.getsockopt_string(zmq.LAST_ENDPOINT), "heartbeat": 5.0,
                       "world_size": 2, "term": 0, **(hello or {})}
        self._outbox: queue.Queue = queue.Queue()
        self._beat_ident = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def send(self, frames, to_router=False):
        self._outbox.put((frames, to_router))

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.router.close()
        self.pub.close()

    def _serve(self):
        while not self._stop.is_set():
            if self.router.poll(10):
                ident, *frames = self.router.recv_multipart()
                body, _ = p.unpack(self._key, JOB, frames)
                reply = None
                if body["type"] == p.HELLO:
                    reply = (self._hello, [])
                elif body["type"] == p.REGISTER:
                    header, blobs = _view_blobs()
                    reply = ({"type": p.OK, "rank": 0, "clock": 0, "members": [], "epoch": 0, "min_clock": 0,
                              "donor": None, "view": header}, blobs)
                elif body["type"] in (p.HEARTBEAT, p.MEMBERS):
                    self._beat_ident = ident
                if reply:
                    self.router.send_multipart([ident, *p.pack(self._key, JOB, {**reply[0], "id": body["id"]},
                                                               reply[1])])
            while not self._outbox.empty():
                frames, to_router = self._outbox.get()
                if not to_router:
                    self.pub.send_multipart(frames)
                elif self._beat_ident is not None:
                    self.router.send_multipart([self._beat_ident, *frames])


def test_every_message_from_a_key_holder_leaves_the_client_serving():
    fake = FakeCoordinator(KEY)
    ticks = itertools.count(1)
    try:
        client = Client(fake.address, JOB, KEY, rank=0, connect_timeout=5.0, successor_wait=0.3)
        try:
            client.register(("127.0.0.1", 9000))

            def alive():
                """A valid tick still reaches the client: its thread reads and applies events."""
                n = next(ticks)
                deadline = time.monotonic() + 20
                while client.min_clock != n and time.monotonic() < deadline:
                    fake.send(p.pack(control_key(KEY), JOB, {"type": p.TICK, "epoch": 0, "min_clock": n, "term": 0}))
                    time.sleep(0.02)
                assert client.min_clock == n and client._listener._thread.is_alive()

            alive()

            @FUZZ
            @given(_messages(EVENT_FIELDS), st.booleans())
            def check(message, to_router):
                body, blobs = message
                # A valid ENDED is final (the job is over): tested in test_job_end.
                assume(not (body["type"] == p.ENDED and isinstance(body.get("term"), int)
                            and 0 <= body["term"] < p.MAX_COUNT))
                fake.send(p.pack(control_key(KEY), JOB, body, blobs), to_router)
                alive()

            check()
            assert sum(client.rejected.values()) > 0 and not client.ended
            # the failover takes seconds on a busy host
            assert client.following or wait_event(client, "coordinator_moved", timeout=30)
        finally:
            client.close()
    finally:
        fake.close()


@pytest.mark.parametrize("field,value", [("heartbeat", 0), ("heartbeat", "fast"), ("pub", "nowhere"),
                                         ("world_size", -1), ("term", 2.5)])
def test_a_malformed_hello_is_a_clear_error(field, value):
    fake = FakeCoordinator(KEY, hello={field: value})
    try:
        with pytest.raises(ControlError, match=f"malformed hello from the coordinator: {field}"):
            Client(fake.address, JOB, KEY, rank=0, connect_timeout=5.0)
    finally:
        fake.close()
