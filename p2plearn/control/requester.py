"""Requests from a control client to its coordinator, and their replies.

One DEALER socket carries the caller's requests and one-way reports; the client's background
thread shares it (a failover re-registers through it, and replaces it when it follows another
coordinator), so it is used under one lock. Probing a candidate coordinator uses a socket of its
own. A reply is matched to its request by id; anything not signed with the job's key is ignored.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import zmq

from . import protocol as p
from .errors import ControlError, Refused, SelfConnected

log = logging.getLogger("p2plearn.control")
WAIT_NOTICE_S = 5.0  # start-up waits longer than this say what they wait for


def connect_dealer(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A DEALER connected to ``endpoint`` that drops what it holds when closed."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def send_signed(sock: zmq.Socket, key: bytes, job_id: str, body: dict[str, Any],
                blobs: list[bytes] | None = None) -> None:
    """Send ``body`` signed with the job's control key, without blocking (``zmq.Again`` if the queue is full)."""
    sock.send_multipart(p.pack(key, job_id, body, blobs), flags=zmq.NOBLOCK)


class Requester:
    """Request/reply with the coordinator at ``endpoint``.

    - ``timeout``: seconds a single request may take before ControlError (requests are small; raise
      it only on a very slow network).
    - ``session``: this client's id, sent with each request; a reply carrying it under the request's
      own type is this socket's echo (``SelfConnected``).
    - ``check``: raises once the client may make no request (its life cycle); called before each
      request and after one timed out, so that a wait cut short by the end says why.
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, key: bytes, job_id: str, session: str, timeout: float,
                 check: Callable[[], None]) -> None:
        self.endpoint = endpoint  # the coordinator followed now; changed by switch()
        self.timeout = timeout
        self._ctx = ctx
        self._key = key
        self._job_id = job_id
        self._session = session
        self._check = check
        self._ids = itertools.count()
        self._lock = threading.Lock()  # one request on the socket at a time; switch() and close() take it too
        self._sock = connect_dealer(ctx, endpoint)

    def request(self, body: dict[str, Any], timeout: float | None = None, *, sock: zmq.Socket | None = None,
                blobs: list[bytes] | None = None) -> tuple[dict, list[bytes]]:
        """Send ``body`` (through ``sock``, default: the coordinator's) and wait for its reply;
        raises ControlError on refusal or timeout."""
        self._check()
        timeout = self.timeout if timeout is None else timeout
        rid = next(self._ids)
        with self._lock:
            sock = sock or self._sock
            try:
                send_signed(sock, self._key, self._job_id, {**body, "id": rid, "session": self._session}, blobs)
            except zmq.Again:
                raise ControlError(f"cannot send {body['type']} to the coordinator at {self.endpoint}") from None
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                if not sock.poll(left * 1000):
                    break
                frames = sock.recv_multipart()
                refusal = p.parse_refusal(frames)
                if refusal is not None and refusal.get("id") == rid:
                    raise Refused(f"coordinator at {self.endpoint} refused {body['type']}: {refusal['reason']}")
                try:
                    reply, blobs_in = p.unpack(self._key, self._job_id, frames)
                except p.AuthError:
                    continue  # not from our coordinator: ignore, do not trust
                if reply.get("type") == body["type"] and reply.get("session") == self._session:
                    raise SelfConnected(f"{body['type']} to {self.endpoint} came back from this socket itself")
                if reply.get("id") != rid:
                    continue  # a late reply to an earlier request that timed out
                if reply["type"] == p.ERROR:
                    raise ControlError(f"coordinator refused {body['type']}: {reply['reason']}")
                return reply, blobs_in
        self._check()
        raise ControlError(f"no reply to {body['type']} from the coordinator at {self.endpoint} in {timeout:g} s")

    def post(self, body: dict[str, Any]) -> bool:
        """Send ``body`` one-way to the coordinator; False if its queue is full (it is not reading)."""
        with self._lock:
            try:
                send_signed(self._sock, self._key, self._job_id, body)
            except zmq.Again:
                return False
        return True

    def hello(self, connect_timeout: float, sock: zmq.Socket | None = None, endpoint: str | None = None) -> dict:
        """Reach the coordinator (through ``sock``, connected to ``endpoint``; default: the one
        followed), retrying while it may still be starting; its settings, checked."""
        start = time.monotonic()
        noticed = False
        while True:
            try:
                reply = self.request({"type": p.HELLO}, timeout=min(self.timeout, 1.0), sock=sock)[0]
                break
            except Refused:
                raise
            except ControlError as exc:
                if isinstance(exc, SelfConnected):  # connect again: a new source port, the listener by then
                    reconnect = sock or self._sock
                    reconnect.disconnect(endpoint or self.endpoint)
                    reconnect.connect(endpoint or self.endpoint)
                waited = time.monotonic() - start
                if waited >= connect_timeout:
                    raise ControlError(f"no coordinator answered at {self.endpoint} within {connect_timeout:g} s") from None
                if waited >= WAIT_NOTICE_S and not noticed and sock is None:
                    noticed = True
                    log.warning("p2plearn: waiting for the coordinator at %s (%.0f s so far; rank 0 starts it)",
                                self.endpoint, waited)
        with checked("hello"):
            return hello_settings(reply)

    def probe(self, endpoint: str, wait: float) -> dict | None:
        """The settings of a coordinator answering at ``endpoint`` within ``wait`` s, else None;
        the coordinator followed stays the same."""
        try:
            sock = connect_dealer(self._ctx, endpoint)
        except zmq.ZMQError:
            return None  # an endpoint libzmq cannot connect to (a host name it cannot resolve, say)
        try:
            return self.hello(wait, sock=sock, endpoint=endpoint)
        except ControlError:
            return None
        finally:
            sock.close()

    def switch(self, endpoint: str) -> None:
        """Follow the coordinator at ``endpoint`` on a new socket: nothing queued for the old one goes there."""
        with self._lock:
            self._sock.close()
            self._sock = connect_dealer(self._ctx, endpoint)
            self.endpoint = endpoint

    def close(self) -> None:
        with self._lock:
            self._sock.close()


def hello_settings(hello: dict) -> dict[str, Any]:
    """A coordinator's hello, checked: settings a client can run with, or ``protocol.BadField``."""
    return {"heartbeat": p.number(hello.get("heartbeat"), "heartbeat", 0.001, 60.0),
            "world_size": p.integer(hello.get("world_size"), "world_size", 0, p.MAX_RANK + 1),
            "pub": p.valid_endpoint(hello.get("pub"), "pub"), "term": p.integer(hello.get("term", 0), "term"),
            "phi_threshold": p.number(hello.get("phi_threshold", 8.0), "phi_threshold", 0.1, 1000.0),
            "startup_grace": p.number(hello.get("startup_grace", 60.0), "startup_grace", 0.0, 1e6)}


@contextmanager
def checked(what: str) -> Iterator[None]:
    """A malformed reply is the coordinator's fault: ControlError, as a refusal would be."""
    try:
        yield
    except p.BadField as exc:
        raise ControlError(f"malformed {what} from the coordinator: {exc}") from None
