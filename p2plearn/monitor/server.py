"""The dashboard: a read-only HTTP server of one job's page, its JSON and ``/metrics``, in the coordinator's process.

It runs on a thread of its own and never takes the coordinator's lock: the coordinator hands its
``JobRecord`` a snapshot every tick, and this thread folds it in and answers from it. One request
is served at a time, each with ``REQUEST_TIMEOUT_S`` to arrive (a slow or idle client delays the
page, never the coordinator), and what a client can make it allocate is bounded: the standard
library caps a request line at 64 KiB and its headers at 100, no request body is read, the path
is capped at ``MAX_PATH``, every answer is cached per record version (many browsers polling
cost one encoding per change), and at most ``MAX_REQUESTS_PER_S`` are served per second (this
thread shares the interpreter with the coordinator's).

Address: ``[HOST:]PORT``; the host defaults to 127.0.0.1 (this host only: open it elsewhere
through an ssh tunnel, ``ssh -L PORT:127.0.0.1:PORT host``); port 0 takes a free port. Any
other host serves only requests that carry the token (``?token=...``) derived from the job's
secret (``dashboard_token``): the URL printed at start carries it, and whoever holds the secret
can compute it. A port already taken (the predecessor's, not yet freed) falls back to a free one.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..keys import control_key
from . import page
from .metrics import metrics_text
from .record import JobRecord

log = logging.getLogger("p2plearn.monitor")

REQUEST_TIMEOUT_S = 2.0  # a client has this long to send its request and read the answer
FOLD_EVERY_S = 0.25      # how often the record takes in the coordinator's latest snapshot
MAX_REQUESTS_PER_S = 20  # served per second at most, by all clients together (a page polls once a second)
MAX_PATH = 2048
TOKEN_LABEL = b"p2plearn dashboard token"


def dashboard_token(secret: str | bytes) -> str:
    """The token a non-loopback dashboard asks for, from the job's secret (``P2PLEARN_JOB_KEY``)."""
    return hmac.new(control_key(secret), TOKEN_LABEL, hashlib.sha256).hexdigest()[:32]


def parse_address(spec: str) -> tuple[str, int]:
    """``"8265"`` -> ("127.0.0.1", 8265); ``"0.0.0.0:8265"``, ``"[::1]:0"``; raises ValueError."""
    host, sep, port = spec.strip().rpartition(":")
    host = host.strip("[]") if sep else "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"dashboard address {spec!r}: expected [HOST:]PORT with a port in 0..65535")
    return host or "127.0.0.1", int(port)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Dashboard:
    """Serve ``record`` at ``address`` (``[HOST:]PORT``) until ``stop()``.

    - ``secret``: the job's secret; a non-loopback bind asks for its ``dashboard_token``.
    - ``advertise``: the host name put in ``url`` when bound to a wildcard address.
    """

    def __init__(self, record: JobRecord, address: str, secret: str | bytes, *, advertise: str | None = None) -> None:
        host, port = parse_address(address)
        self.record = record
        self.token = None if is_loopback(host) else dashboard_token(secret)
        self._cache: dict[str, tuple[int, bytes]] = {}  # path -> (record version, body): this thread's
        self._stop = threading.Event()
        self._http = _bind(host, port, _handler(self))
        self._http.timeout = FOLD_EVERY_S
        bound = self._http.server_address[1]
        shown = advertise or socket.gethostname() if host in ("0.0.0.0", "::") else host
        shown = f"[{shown}]" if ":" in shown else shown
        self.port = bound
        self.url = f"http://{shown}:{bound}/" + (f"?token={self.token}" if self.token else "")
        self._thread = threading.Thread(target=self._serve, name="p2plearn-dashboard", daemon=True)

    def start(self) -> Dashboard:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * FOLD_EVERY_S + REQUEST_TIMEOUT_S)
        self._http.server_close()

    def _serve(self) -> None:
        second, served = 0, 0
        while not self._stop.is_set():
            self._http.handle_request()  # returns after FOLD_EVERY_S without a request
            self.record.update()
            now = time.monotonic()
            second, served = (second, served + 1) if int(now) == second else (int(now), 1)
            if served >= MAX_REQUESTS_PER_S:
                # This thread shares the interpreter lock with the coordinator's: bound its share,
                # whatever the clients ask (requests wait in the listen backlog meanwhile).
                self._stop.wait(second + 1 - now)

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        """(status, content type, body) of a GET (the monitor's thread)."""
        if self.token is not None and not hmac.compare_digest(query.get("token", [""])[0].encode(),
                                                              self.token.encode()):
            return 403, "text/plain", b"this dashboard asks for its token: ?token=... (see docs/monitor.md)\n"
        if path in page.STATIC:
            return (200, *page.STATIC[path])
        self.record.update()
        if path == "/":
            return 200, "text/html; charset=utf-8", self._cached(path, lambda: page.html(self.record.to_json()))
        if path == "/api/state":
            return 200, "application/json", self._cached(path, lambda: json.dumps(self.record.to_json()).encode())
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", self._cached(path, lambda: metrics_text(self.record))
        return 404, "text/plain", b"not found\n"

    def _cached(self, path: str, make: Any) -> bytes:
        version, body = self._cache.get(path, (-1, b""))
        if version != self.record.version:
            version, body = self.record.version, make()
            self._cache[path] = (version, body)
        return body


def _bind(host: str, port: int, handler: type) -> HTTPServer:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("DashboardHTTPServer", (HTTPServer,), {"address_family": family, "allow_reuse_address": True})
    try:
        return server_class((host, port), handler)
    except OSError as exc:
        if port == 0:
            raise
        log.warning("dashboard: port %d is taken (%s): serving on a free port instead", port, exc.strerror)
        return server_class((host, 0), handler)


def _handler(dashboard: Dashboard) -> type:
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S
        server_version = "p2plearn-dashboard"

        def do_GET(self) -> None:
            if len(self.path) > MAX_PATH:
                self._send(414, "text/plain", b"path too long\n")
                return
            parts = urlsplit(self.path)
            try:
                query = parse_qs(parts.query, max_num_fields=8)
            except ValueError:
                self._send(400, "text/plain", b"too many query fields\n")
                return
            self._send(*dashboard.answer(parts.path, query))

        def do_HEAD(self) -> None:
            self._send(405, "text/plain", b"")

        do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD  # read-only

        def _send(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Security-Policy", page.CSP)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            pass  # a page polled every second would flood the coordinator's stderr

    return Handler
