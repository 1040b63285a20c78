"""Wire format of the control plane: signed JSON messages over ZeroMQ.

A message is a list of frames ``[body, tag, *blobs]``:

- ``body``: UTF-8 JSON object with at least ``type`` and ``job`` (the job id);
- ``tag``: HMAC-SHA256 of ``body`` and every blob under the control key (``p2plearn.keys``);
- ``blobs``: optional raw byte frames (the numpy arrays of a GlobalView). Nothing on the
  control plane carries tensors: blobs are per-peer scalars (rates, load, alive).

A message whose tag or job id does not match is refused. The tag authenticates membership
in the job; it does not prevent replay of a captured message inside the same job (the
control plane runs inside a trusted cluster; the key keeps other jobs and strangers out).

The coordinator's broadcasts (PUB -> SUB: membership, clocks, loss, views) are also encrypted:
anyone may connect to a PUB socket, so it is a CurveZMQ server whose key pair derives from the
job's secret (``pub_keys``), and only a key holder, who can derive its public key, completes the
handshake; a subscriber without the key receives nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import zmq
from zmq.utils import z85

from ..keys import hkdf

PUB_LABEL = b"p2plearn control pub curve v1"  # HKDF label of the broadcasts' CurveZMQ key
MAX_REQUEST_BYTES = 16 << 20  # a request (all frames) larger than this drops its connection

# Requests (client -> coordinator, DEALER -> ROUTER).
HELLO = "hello"          # -> pub endpoint, heartbeat settings, term
REGISTER = "register"    # rank, host, engine, standby, join, session, [resume] -> membership, view (+ donor)
HEARTBEAT = "heartbeat"  # one-way (answered only when the sender is unknown or taken back)
REPORT = "report"        # one-way: clock and measurements of one round
MEMBERS = "members"      # -> membership snapshot
VIEW = "view"            # -> GlobalView
LEAVE = "leave"          # -> ok
STEP_DOWN = "step_down"  # term, endpoint: a successor started; the old coordinator sends everyone there
STATE = "state"          # rank, session -> donor: a joiner whose state did not come asks for it again
REACH = "reach"          # rank, session, reached (ranks its multicast probe reached) -> ok
# Replies.
OK = "ok"
ERROR = "error"
REFUSED = "refused"      # unsigned: the sender could not be authenticated
# Events (coordinator -> every client, PUB -> SUB).
TICK = "tick"            # coordinator alive; carries membership epoch, min clock, term and progress
MEMBER = "member"        # join / leave / dead of one rank
CLOCK = "clock"          # the slowest live peer's clock changed
DONATE = "donate"        # ask a donor to send its state to a joiner
MOVED = "moved"          # endpoint, term: a successor took over; go there
ENDED = "ended"          # term, most_members, most_planned: the coordinator stopped at the end of its job


MAX_RANK = 1 << 20       # ranks, like every count of peers, are below this
MAX_COUNT = 1 << 62      # clocks, terms, epochs, ids: non-negative integers below this
MAX_RATE = 1.25e13       # bytes/s: 100 Tbit/s; a rate from a peer at or above it is not believed


class AuthError(Exception):
    """A message failed authentication (wrong job key or job id)."""


class BadField(ValueError):
    """A field of an authenticated message is missing, mistyped or out of range: the message is
    refused (counted, and answered with an error where a reply is due), never half-applied."""


def integer(value: Any, name: str, low: int = 0, high: int = MAX_COUNT) -> int:
    """``value`` as an int in [``low``, ``high``); JSON booleans and floats are refused."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
        raise BadField(f"{name} must be an integer in [{low}, {high}), got {str(value)[:60]}")
    return value


def number(value: Any, name: str, low: float = 0.0, high: float = float("inf")) -> float:
    """``value`` as a float in [``low``, ``high``) (so never NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < high:
        raise BadField(f"{name} must be a number in [{low:g}, {high:g}), got {str(value)[:60]}")
    return float(value)


def loss_value(value: Any) -> float | None:
    """None, or any number: a diverged peer's loss is NaN or infinite, and is shown as it is."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise BadField(f"loss must be a number, got {str(value)[:60]}")
    return None if value is None else float(value)


def text(value: Any, name: str, limit: int = 256) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise BadField(f"{name} must be a string of at most {limit} characters, got {str(value)[:60]}")
    return value


def valid_endpoint(value: Any, name: str) -> str:
    """``value`` if it is an endpoint a client can connect to: ``tcp://host:port`` (port 1-65535)
    or ``ipc:///path``."""
    ep = text(value, name)
    scheme, sep, rest = ep.partition("://")
    host, colon, port = rest.rpartition(":")
    tcp_ok = (scheme == "tcp" and colon and host and not any(c.isspace() for c in host)
              and port.isascii() and port.isdigit() and 0 < int(port) < 65536)
    ipc_ok = scheme == "ipc" and 1 < len(rest) <= 107  # the longest path a unix socket can bind
    if not sep or not (tcp_ok or ipc_ok):
        raise BadField(f"{name} must be tcp://host:port or ipc:///path, got {ep[:60]!r}")
    return ep


def engine_address(value: Any) -> tuple[str, int] | None:
    """A data engine's ``[host, port]`` (None: not started yet)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise BadField(f"engine must be [host, port], got {str(value)[:60]}")
    host = text(value[0], "engine host")
    if not host:
        raise BadField("engine host is empty")
    return host, integer(value[1], "engine port", 1, 65536)


def _tag(key: bytes, body: bytes, blobs: list[bytes]) -> bytes:
    mac = hmac.new(key, body, hashlib.sha256)
    for blob in blobs:
        mac.update(blob)
    return mac.digest()


def pack(key: bytes, job: str, body: dict[str, Any], blobs: list[bytes] | None = None) -> list[bytes]:
    """Frames of a signed message; ``body`` gets the job id added."""
    blobs = blobs or []
    raw = json.dumps({**body, "job": job}, separators=(",", ":")).encode()
    return [raw, _tag(key, raw, blobs), *blobs]


def unpack(key: bytes, job: str, frames: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
    """Body and blobs of a message; raises AuthError if it is not from this job."""
    if len(frames) < 2:
        raise AuthError("malformed message")
    raw, tag, blobs = frames[0], frames[1], list(frames[2:])
    if not hmac.compare_digest(tag, _tag(key, raw, blobs)):
        raise AuthError("bad authentication tag (wrong job key?)")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise AuthError(f"malformed body: {exc!r}") from None
    if not isinstance(body, dict) or body.get("job") != job:
        raise AuthError("wrong job id")
    return body, blobs


def pub_keys(secret: str | bytes) -> tuple[bytes, bytes]:
    """The broadcasts' CurveZMQ key pair (public, secret; Z85) derived from the job's secret."""
    private = z85.encode(hkdf(secret, PUB_LABEL, 32))
    return zmq.curve_public(private), private


def encrypt_broadcasts(pub: zmq.Socket, secret: str | bytes) -> None:
    """Make ``pub`` (before it binds) a CurveZMQ server only key holders can subscribe to."""
    _require_curve()
    pub.curve_secretkey = pub_keys(secret)[1]
    pub.curve_server = True


def subscribe_encrypted(sub: zmq.Socket, secret: str | bytes) -> None:
    """Make ``sub`` (before it connects) a CurveZMQ client of a PUB set up by ``encrypt_broadcasts``:
    it authenticates the coordinator by the public key derived from the secret."""
    _require_curve()
    sub.curve_serverkey = pub_keys(secret)[0]
    sub.curve_publickey, sub.curve_secretkey = zmq.curve_keypair()


def _require_curve() -> None:
    if not zmq.has("curve"):
        raise RuntimeError(f"this libzmq ({zmq.zmq_version()}) was built without CURVE, which encrypts the "
                           "control plane's broadcasts: install pyzmq's wheel (it bundles a libzmq with it)")


def refusal(reason: str, request_id: Any) -> list[bytes]:
    """An unsigned refusal: the coordinator cannot sign for a key it does not share."""
    raw = json.dumps({"type": REFUSED, "reason": reason, "id": request_id}).encode()
    return [raw, b""]


def parse_refusal(frames: list[bytes]) -> dict[str, Any] | None:
    """The body of an unsigned refusal, or None if ``frames`` is not one."""
    if len(frames) != 2 or frames[1] != b"":
        return None
    try:
        body = json.loads(frames[0])
    except ValueError:
        return None
    return body if isinstance(body, dict) and body.get("type") == REFUSED else None


def endpoint(address: str) -> str:
    """A ZeroMQ endpoint from ``host:port``, ``tcp://host:port`` or ``ipc:///path``."""
    if "://" in address:
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"coordinator address {address!r} is not host:port, tcp://host:port or ipc:///path")
    return f"tcp://{host}:{port}"


def set_transport_heartbeat(sock: zmq.Socket, heartbeat: float) -> None:
    """ZeroMQ-level pings every ``heartbeat`` s; a connection silent for 10 of them (at least 5 s)
    is closed, which the socket's monitor reports. libzmq's I/O thread answers pings without the
    interpreter lock, so only a stopped process or a lost host goes that long; the phi detectors
    judge shorter stalls."""
    silent = int(max(5.0, 10 * heartbeat) * 1000)
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(heartbeat * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, silent)
    sock.setsockopt(zmq.HEARTBEAT_TTL, silent)
