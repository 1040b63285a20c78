"""A control client's background thread: heartbeats out, pushed events in, the coordinator watched.

It subscribes to the coordinator's PUB stream (ticks, membership, clock, views, donor requests,
progress, the end of the job), sends this member's heartbeats on a DEALER of its own (whose
replies, and answers to a resync, come back on it), and judges the coordinator with a
phi-accrual detector fed by the ticks, a closed connection (seen by a monitor of that DEALER)
shortening the wait. When the coordinator is suspected, or said it moved, the thread runs the
client's failover; once that follows another coordinator it opens its streams there.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import protocol as p
from .detector import PhiAccrualDetector
from .lifecycle import Lifecycle
from .requester import send_signed

# What a client is sent (a malformed message of another type is counted as "unknown").
MESSAGES = (p.TICK, p.MEMBER, p.CLOCK, p.VIEW, p.DONATE, p.MOVED, p.ENDED, p.OK, p.ERROR)
Streams = tuple[zmq.Socket, zmq.Socket, zmq.Socket, zmq.Poller]  # sub, heartbeat DEALER, its monitor, their poller


class Listener:
    """The thread that keeps a client in touch with its coordinator, while its life cycle says it listens.

    - ``secret`` / ``key``: the job's secret (the PUB stream is encrypted with a key derived from
      it) and the control key every message is signed with.
    - ``heartbeat`` / ``phi_threshold``: the coordinator's settings (its hello), for the beats and the detector.
    - ``rank``: this peer's rank now (a joiner learns it at registration), sent with each beat.
    - ``coordinator``: the (request endpoint, PUB endpoint as reached from here, term) followed now.
    - ``dispatch(kind, body, blobs)``: applies one message signed with the job's key; what it
      raises counts the message as malformed (``rejected``), as if it never came.
    - ``failover_due``: whether the coordinator said where it moved (a failover is due without a suspicion).
    - ``failover(receive_pending)``: finds and follows the coordinator; False once there is none to
      follow (the thread then ends). ``receive_pending`` applies what the old stream still holds.
    """

    def __init__(self, ctx: zmq.Context, secret: str | bytes, key: bytes, job_id: str, session: str,
                 lifecycle: Lifecycle, *, heartbeat: float, phi_threshold: float,
                 rank: Callable[[], int | None], coordinator: Callable[[], tuple[str, str, int]],
                 dispatch: Callable[[str, dict, list[bytes]], None], failover_due: Callable[[], bool],
                 failover: Callable[[Callable[[], None]], bool]) -> None:
        self.heartbeat = heartbeat
        self._phi_threshold = phi_threshold
        self.subscribed = threading.Event()  # set by the first tick: pushed events reach this client
        self.rejected: Counter[str] = Counter()  # malformed messages from a key holder, by type, dropped
        # Judges the coordinator: fed and replaced (restart_detector) on this thread, read by any.
        self.detector = self._new_detector()
        self._ctx = ctx
        self._secret = secret
        self._key = key
        self._job_id = job_id
        self._session = session
        self._life = lifecycle
        self._rank = rank
        self._coordinator = coordinator
        self._dispatch = dispatch
        self._failover_due = failover_due
        self._failover = failover
        self._beats = 0       # heartbeats sent: the next one's id
        self._streams: Streams | None = None  # the thread's own, open while it runs
        self._thread = threading.Thread(target=self._run, name="p2plearn-control-client", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def next_beat_id(self) -> int:
        """The id the next heartbeat will carry: a reply to one sent before now has a lower one."""
        return self._beats

    def heard(self) -> None:
        """The coordinator ticked (any thread's view of it is current)."""
        self.detector.heartbeat()
        self.subscribed.set()

    def restart_detector(self) -> None:
        """A coordinator was (re)found: judge it from a fresh history."""
        self.detector = self._new_detector()

    def ask_for_members(self) -> None:
        """Ask for a whole membership snapshot (it comes back on this thread's DEALER). Called on this thread."""
        if self._streams is not None:
            self._send(self._streams[1], {"type": p.MEMBERS})

    def _new_detector(self) -> PhiAccrualDetector:
        # Ticks come from a process of its own, so no start-up grace beyond a few heartbeats; the
        # extra pause tolerated costs a failover a second, and saves one on a stall of this process.
        return PhiAccrualDetector(self.heartbeat, threshold=self._phi_threshold,
                                  acceptable_pause=max(2.0, 4 * self.heartbeat), grace=max(3.0, 6 * self.heartbeat))

    def _send(self, sock: zmq.Socket, body: dict) -> None:
        try:
            send_signed(sock, self._key, self._job_id, body)
        except zmq.Again:
            pass  # queue full: the coordinator is not reading; its silence will tell

    def _run(self) -> None:
        streams = self._streams = self._open_streams()
        next_beat = 0.0
        try:
            while self._life.phase.listening:
                sub, beat, monitor, poller = streams
                for sock, _ in poller.poll(timeout=self.heartbeat * 200):  # a fifth of a period, in ms
                    if sock is monitor:
                        if recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED:
                            self.detector.lost()  # the coordinator's process closed its end
                        continue
                    self._receive_pending(sock)
                now = time.monotonic()
                # A peer that left, or whose job ended, follows no successor; one that left keeps
                # listening (it may wait until it is alone), for a suspicion may be a busy host.
                if self._life.phase.in_job and (self._failover_due() or self.detector.suspected(now)):
                    following = self._coordinator()
                    if not self._failover(lambda: self._receive_pending(sub)):
                        return
                    if self._coordinator() != following:
                        _close(streams)
                        streams = self._streams = self._open_streams()
                    # else the coordinator was only slow (or this process was): the connections
                    # stay, for a member whose connections close is taken for a process that exited
                    continue
                if now >= next_beat:
                    if self._life.phase.member:
                        self._beat(beat)
                    next_beat = now + self.heartbeat
        finally:
            self._streams = None
            _close(streams)

    def _open_streams(self) -> Streams:
        endpoint, pub, _ = self._coordinator()
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        p.subscribe_encrypted(sub, self._secret)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub)
        beat = self._ctx.socket(zmq.DEALER)
        beat.setsockopt(zmq.LINGER, 0)
        p.set_transport_heartbeat(beat, self.heartbeat)  # a paused or lost coordinator closes this connection
        beat.connect(endpoint)
        monitor = beat.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller = zmq.Poller()
        for sock in (sub, beat, monitor):
            poller.register(sock, zmq.POLLIN)
        return sub, beat, monitor, poller

    def _beat(self, beat: zmq.Socket) -> None:
        beat_id, self._beats = self._beats, self._beats + 1
        self._send(beat, {"type": p.HEARTBEAT, "rank": self._rank(), "session": self._session, "id": beat_id})

    def _receive_pending(self, sock: zmq.Socket) -> None:
        while sock.poll(0):
            self._receive(sock.recv_multipart())

    def _receive(self, frames: list[bytes]) -> None:
        try:
            body, blobs = p.unpack(self._key, self._job_id, frames)
        except p.AuthError:
            return  # a stranger's message: drop it
        kind = body.get("type")
        try:
            self._dispatch(kind, body, blobs)
        except Exception:  # a key holder's malformed message: as if it never came, counted
            self.rejected[kind if kind in MESSAGES else "unknown"] += 1


def _close(streams: Streams) -> None:
    sub, beat, monitor, _ = streams
    beat.disable_monitor()
    for sock in (monitor, sub, beat):
        sock.close()


def reachable(pub: str, request_endpoint: str) -> str:
    """The PUB endpoint as seen from here: the host this client used, with the PUB port."""
    if pub.startswith("tcp://") and request_endpoint.startswith("tcp://"):
        return request_endpoint.rsplit(":", 1)[0] + ":" + pub.rsplit(":", 1)[1]
    return pub
