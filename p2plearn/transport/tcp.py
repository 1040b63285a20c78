"""`TcpChannel`: the same interface as `Channel` over pyzmq (TCP), reliable and unpaced.

This is the baseline the experiments compare the engine against: every byte arrives, TCP's
congestion control paces, and a lost segment costs a retransmission timeout in the tail.
One background thread owns every zmq socket (they are not thread-safe); callers talk to it
through a queue and an inproc wake-up socket.
"""
from __future__ import annotations

import itertools
import json
import queue
import threading
import time
from typing import Any, Iterable, Sequence

import numpy as np
import zmq

from p2plearn.transport.arrays import as_numpy, decode_descriptor, encode_descriptor
from p2plearn.transport.channel import ReceiverStats, _receiver_tuple
from p2plearn.transport.delivery import Delivery, Reason


class TcpSendHandle:
    """A send in flight; `wait` returns per-receiver stats once each receiver acknowledged."""

    def __init__(self, receivers: list[tuple[str, int, float]], nbytes: int, narrays: int, deadline: float | None):
        self.receivers = receivers
        self._nbytes, self._narrays = nbytes, narrays
        self._start = time.monotonic()
        self._deadline = None if deadline is None else self._start + deadline
        self._acked: dict[int, float] = {}
        self._cv = threading.Condition()

    def _ack(self, i: int) -> None:
        with self._cv:
            self._acked.setdefault(i, time.monotonic())
            self._cv.notify_all()

    def done(self) -> bool:
        with self._cv:
            return len(self._acked) == len(self.receivers)

    def wait(self, timeout: float | None = None) -> list[ReceiverStats]:
        """Block until every receiver acknowledged, or the send's deadline passed."""
        until = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while len(self._acked) < len(self.receivers):
                ends = [t for t in (until, self._deadline) if t is not None]
                left = min(ends) - time.monotonic() if ends else None
                if left is not None and left <= 0:
                    if self._deadline is not None and time.monotonic() >= self._deadline:
                        break
                    raise TimeoutError(f"send not finished after {timeout} s")
                self._cv.wait(left)
            return [self._stats(i) for i in range(len(self.receivers))]

    def _stats(self, i: int) -> ReceiverStats:
        at = self._acked.get(i)
        elapsed = (at if at is not None else time.monotonic()) - self._start
        ok = at is not None
        host, port, _ = self.receivers[i]
        return ReceiverStats(receiver=(host, port), result="exact" if ok else "deadline",
                             fractions=[1.0 if ok else 0.0] * self._narrays, delivered=1.0 if ok else 0.0,
                             datagrams_sent=0, retransmitted=0, datagrams_received=0, passes=1,
                             elapsed_s=elapsed, delivery_rate=self._nbytes / elapsed if ok and elapsed > 0 else 0.0,
                             ack_rate=0.0,  # the kernel's ACKs are not ours to time: no rate sample
                             loss_rate=0.0, rtt_s=0.0)


class TcpChannel:
    """Reliable point-to-multipoint over TCP (one copy per receiver), with `Channel`'s interface.

    Args: host, port (0 = any free port), sender_id. Receiver rates and loss bounds are accepted
    and ignored: TCP delivers everything and paces itself.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, sender_id: int = 0, **_ignored: Any):
        self.sender_id = sender_id
        self._ctx = zmq.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        if port:
            self._router.bind(f"tcp://{host}:{port}")
        else:
            port = self._router.bind_to_random_port(f"tcp://{host}")
        self.address: tuple[str, int] = (host, port)
        self._wake_addr = f"inproc://tcp-channel-{id(self)}"
        self._wake_rx = self._ctx.socket(zmq.PULL)
        self._wake_rx.bind(self._wake_addr)
        self._wake_tx = self._ctx.socket(zmq.PUSH)
        self._wake_tx.connect(self._wake_addr)
        self._wake_lock = threading.Lock()
        self._outbox: queue.Queue = queue.Queue()
        self._inbox: queue.Queue = queue.Queue()
        self._pending: dict[int, tuple[TcpSendHandle, int]] = {}
        self._tokens = itertools.count()
        self._counters = {"bytes_sent": 0, "bytes_received": 0, "messages_sent": 0, "messages_delivered": 0}
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="TcpChannel", daemon=True)
        self._thread.start()

    def send(self, msg_id: int, arrays: Sequence[Any], receivers: Iterable[Any],
             loss_bounds: float | Sequence[float] = 0.0, deadline: float | None = None, **_ignored: Any) -> TcpSendHandle:
        """Send `arrays` reliably to every receiver ((host, port[, rate]) each); returns at once."""
        if self._closed.is_set():
            raise OSError("channel is closed")
        views = [as_numpy(a) for a in arrays]
        rcv = [_receiver_tuple(r) for r in receivers]
        handle = TcpSendHandle(rcv, sum(v.nbytes for v in views), len(views), deadline)
        header = json.dumps({"sender": self.sender_id, "msg": msg_id}).encode()
        desc = encode_descriptor(views)
        for i, (host, port, _) in enumerate(rcv):
            token = next(self._tokens)
            self._pending[token] = (handle, i)
            self._outbox.put(((host, port), [b"D", header, desc, str(token).encode(), *views]))
        self._wake()
        return handle

    def _wake(self) -> None:
        with self._wake_lock:
            self._wake_tx.send(b"")

    def recv(self, timeout: float | None = None) -> Delivery | None:
        """The next message, or None after `timeout` seconds."""
        try:
            return self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def fill(self, delivery: Delivery, mode: str = "own", own: Sequence[Any] | None = None) -> Delivery:
        """Nothing is ever missing over TCP."""
        return delivery

    def stats(self) -> dict[str, int]:
        return dict(self._counters)

    def _loop(self) -> None:
        dealers: dict[tuple[str, int], zmq.Socket] = {}
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        while not self._closed.is_set():
            for sock, _ in poller.poll(100):
                if sock is self._wake_rx:
                    self._wake_rx.recv()
                elif sock is self._router:
                    self._on_message(self._router.recv_multipart(copy=False))
                else:
                    kind, token = sock.recv_multipart()
                    entry = self._pending.pop(int(token), None)
                    if kind == b"A" and entry:
                        entry[0]._ack(entry[1])
            while not self._outbox.empty():
                addr, frames = self._outbox.get()
                if addr not in dealers:
                    d = self._ctx.socket(zmq.DEALER)
                    d.setsockopt(zmq.LINGER, 0)
                    d.connect(f"tcp://{addr[0]}:{addr[1]}")
                    poller.register(d, zmq.POLLIN)
                    dealers[addr] = d
                dealers[addr].send_multipart(frames, copy=False)
                self._counters["bytes_sent"] += sum(f.nbytes for f in frames[4:])
                self._counters["messages_sent"] += 1
        for d in dealers.values():
            d.close(0)

    def _on_message(self, frames: list[zmq.Frame]) -> None:
        ident, kind, header, desc, token, *data = frames
        if kind.bytes != b"D":
            return
        meta = json.loads(header.bytes)
        layout = decode_descriptor(desc.bytes, [len(f.buffer) for f in data])
        arrays = None
        if layout is not None:
            arrays = [np.frombuffer(f.buffer, dtype=dt).reshape(shape).copy() for f, (dt, shape) in zip(data, layout)]
        self._counters["bytes_received"] += sum(len(f.buffer) for f in data)
        self._counters["messages_delivered"] += 1
        self._router.send_multipart([ident, b"A", token.bytes])
        self._inbox.put(Delivery(sender=meta["sender"], msg_id=meta["msg"], arrays=arrays,
                                 mask=np.ones(1, dtype=bool), reason=Reason.COMPLETE, source=("", 0),
                                 fractions=[1.0] * len(data)))

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake()
        self._thread.join()
        for s in (self._router, self._wake_rx, self._wake_tx):
            s.close(0)
        self._ctx.term()

    def __enter__(self) -> "TcpChannel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
