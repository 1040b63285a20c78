"""Point-to-point sends and receives of one process group (``send``, ``recv``, ``isend``,
``irecv``, ``batch_isend_irecv``), over an engine of their own, on numpy arrays.

As gloo's, a send goes out once its receiver has posted the matching receive: a receive tells its
sender READY (tag, n), ``n`` counting this rank's receives from that sender with that tag, and the
sender's n-th send with that tag goes out then, as a DATA message (tag, n). A DATA message no
receive asked for is refused and counted, so what a member can make a rank hold is the messages of
the receives it posted (and at most MAX_READY promises per sender), and no message is lost to a
quota. Pairs and tags are independent; within a pair and a tag, messages match in call order.

Every message is ``[header, payload...]``: the header is int64 ``[kind, tag, n]``; a READY has no
payload. A DATA message whose payload has other shapes or dtypes than the receive's tensor is
refused; the receive fails after MISMATCH_S without one that fits (the sender's tensor differs, as
gloo's size check fails it). Each operation runs on a thread of its own, so a send waiting for its
receive never holds up another operation or the group's collectives.

A send of at most EAGER_BYTES ends once it is handed to the engine, as gloo's ends once its bytes
are in the socket: its payload is copied first (the engine resends from the copy until the
receiver acknowledges it), so the sender's next operation, typically the receive of the answer,
starts without waiting a one-way trip for the acknowledgement. On a link of one-way latency L a
ping-pong's half then takes about L, not 3L (DATA, its acknowledgement, then the next READY). A
larger send ends at its acknowledgement, as its transfer outlasts that trip anyway. A send that
fails after it ended (its receiver died before acknowledging) is counted (``failed_after_end`` in
the group's stats); the receiver's side raises, and membership fails this rank's next operation
with that rank.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from p2plearn.distributed.sender import POLL_S, CollectiveError, CollectiveTimeout, Sender, check_departed
from p2plearn.transport import Delivery, Reason, TransportError
from p2plearn.transport.channel import PROBE_MSG_IDS

READY, DATA = 0, 1           # a header's kinds
MAX_READY = 1024             # READY promises kept per sender (a member's flood of them is refused beyond)
MISMATCH_S = 10.0            # how long a receive still waits for a fitting message after refusing one
EAGER_BYTES = 1 << 20        # a send this small is copied and ends once handed to the engine (see the docstring)

Finished = Callable[[BaseException | None], None]  # told once an operation ends: None, or its error


class PointToPoint:
    """This rank's sends and receives in a group, over ``sender``'s engine (one no collective uses).

    ``timeout``: seconds a send waits for its receive to be posted, and a receive for its message
    (the group's timeout, as gloo's). ``stats()`` counts what was refused, by reason.
    """

    def __init__(self, sender: Sender, timeout: float) -> None:
        self.sender = sender
        self.timeout = timeout
        self.refused: Counter[str] = Counter()
        self.failed_after_end = 0  # eager sends whose acknowledgement never came (their work had ended)
        self._lock = threading.Lock()  # guards what follows
        self._waiting: dict[tuple[int, int, int, int], threading.Event] = {}  # (kind, peer, tag, n) -> its waiter's
        self._sends: Counter[tuple[int, int]] = Counter()  # (receiver, tag) -> sends called
        self._receives: Counter[tuple[int, int]] = Counter()  # (sender, tag) -> receives called
        self._ready: set[tuple[int, int, int]] = set()  # (receiver, tag, n) promised by READY, not yet sent
        self._promised: Counter[int] = Counter()  # receiver -> its READY promises in _ready
        self._posted: dict[tuple[int, int, int], np.ndarray] = {}  # (sender, tag, n) -> the receive's array
        self._arrived: set[tuple[int, int, int]] = set()  # posted receives whose message was copied in
        self._mismatched: dict[tuple[int, int, int], tuple[float, str]] = {}  # -> (when, the refused shapes)
        self._ids: Counter[int] = Counter()  # receiver -> messages sent to it (their ids)
        self._pump = threading.Thread(target=self._receive_all, name="p2plearn-p2p", daemon=True)
        self._pump.start()

    # -- operations ----------------------------------------------------------------------------
    def send(self, array: np.ndarray, to: int, tag: int, finished: Finished,
             inputs_ready: Callable[[], None] = lambda: None) -> None:
        """Send ``array`` to rank ``to`` once it posted the matching receive (and ``inputs_ready()``
        returned: a staged copy is in); ``finished`` hears when the receiver has it all (or the error)."""
        with self._lock:
            n, self._sends[to, tag] = self._sends[to, tag], self._sends[to, tag] + 1
        self._start(finished, self._send, array, to, tag, n, inputs_ready)

    def recv(self, array: np.ndarray, source: int, tag: int, finished: Finished) -> None:
        """Receive rank ``source``'s next message with ``tag`` into ``array``; ``finished`` hears
        when it is there (or the error)."""
        with self._lock:
            n, self._receives[source, tag] = self._receives[source, tag], self._receives[source, tag] + 1
            self._posted[source, tag, n] = array
        self._start(finished, self._recv, array, source, tag, n)

    def _start(self, finished: Finished, run: Callable[..., None], *args: object) -> None:
        """Run an operation on a thread of its own. ``finished`` hears once: when ``run`` returns or
        raises, or earlier when ``run`` calls the ``ended`` it is given last (an eager send)."""
        told = False

        def ended(error: BaseException | None = None) -> None:
            nonlocal told
            if told:
                if error is not None:
                    with self._lock:
                        self.failed_after_end += 1
                return
            told = True
            finished(error)

        def operation() -> None:
            try:
                run(*args, ended)
            except BaseException as exc:  # the work's wait() raises it
                ended(exc)
            else:
                ended()
        threading.Thread(target=operation, name="p2plearn-p2p-op", daemon=True).start()

    def _send(self, array: np.ndarray, to: int, tag: int, n: int, inputs_ready: Callable[[], None],
              ended: Finished) -> None:
        what = f"send #{n} to rank {to} (tag {tag})"
        message = [_header(DATA, tag, n), array]
        self.sender.check_size(message, what)
        self._wait((READY, to, tag, n), lambda: (to, tag, n) in self._ready, to, what, "its receive was not posted")
        inputs_ready()
        with self._lock:
            self._ready.discard((to, tag, n))
            self._promised[to] -= 1
        eager = array.nbytes <= EAGER_BYTES
        if eager:
            message[1] = array.copy()  # (what the engine resends from once the work has ended)
        handle = self.sender.send(self._next_id(to), message, [to], what)
        if eager:
            ended()
        self.sender.wait([handle], None, what)

    def _recv(self, array: np.ndarray, source: int, tag: int, n: int, ended: Finished) -> None:
        what = f"recv #{n} from rank {source} (tag {tag})"
        try:
            self.sender.check_size([_header(DATA, tag, n), array], what)
            ready = self.sender.send(self._next_id(source), [_header(READY, tag, n)], [source], what)

            def check_ready() -> None:  # (not waited for: a dead sender is named sooner by the membership)
                if ready.done():
                    self.sender.wait([ready], None, what)  # raises if the sender stopped acknowledging

            self._wait((DATA, source, tag, n), lambda: (source, tag, n) in self._arrived, source, what,
                       "no message came", mismatch=(source, tag, n), check=check_ready)
        finally:
            with self._lock:
                self._posted.pop((source, tag, n), None)
                self._arrived.discard((source, tag, n))
                self._mismatched.pop((source, tag, n), None)

    def _wait(self, key: tuple[int, int, int, int], done: Callable[[], bool], peer: int, what: str, missing: str,
              mismatch: tuple[int, int, int] | None = None, check: Callable[[], None] = lambda: None) -> None:
        """Until ``done()`` (read under the lock; the arrival of ``key`` wakes this wait, and only
        this one), or raise: the peer or this rank departed, a message of other shapes was refused
        MISMATCH_S ago, ``check()`` raised, or the group's timeout passed."""
        end = time.monotonic() + self.timeout
        arrived = threading.Event()
        with self._lock:
            self._waiting[key] = arrived
        try:
            while True:
                with self._lock:
                    if done():
                        return
                    refused = self._mismatched.get(mismatch) if mismatch is not None else None
                check_departed(what, [self.sender.rank, peer], self.sender.departed)
                check()
                now = time.monotonic()
                if refused is not None and now >= refused[0] + MISMATCH_S:
                    raise CollectiveError(f"p2plearn: {what}: rank {peer}'s message has shapes {refused[1]}, not this "
                                          f"receive's: do both ranks pass tensors of the same shape and dtype?")
                if now >= end:
                    raise CollectiveTimeout(f"p2plearn: {what}: {missing} in {self.timeout:.0f} s")
                arrived.wait(min(end - now, POLL_S))
        finally:
            with self._lock:
                self._waiting.pop(key, None)

    def _next_id(self, to: int) -> int:
        """A new message id towards ``to`` (an engine refuses an id it delivered from this sender lately)."""
        with self._lock:
            msg_id, self._ids[to] = self._ids[to], (self._ids[to] + 1) % PROBE_MSG_IDS[0]
        return msg_id

    # -- arrivals ------------------------------------------------------------------------------
    def _receive_all(self) -> None:
        """The engine's deliveries, filed as they come, until it closes."""
        while True:
            try:
                d = self.sender.channel.recv(timeout=POLL_S)
            except TransportError:
                return  # closed
            if d is not None:
                with self._lock:
                    why = self._file(d)
                    if why is not None:
                        self.refused[why] += 1

    def _file(self, d: Delivery) -> str | None:
        """Take a READY or an asked-for DATA message; why it is refused otherwise."""
        if not (0 <= d.sender < self.sender.world_size) or d.sender == self.sender.rank:
            return "not a rank of this group"
        if d.reason != Reason.COMPLETE or d.arrays is None or not d.arrays:
            return "incomplete"
        header = d.arrays[0]
        if header.shape != (3,) or header.dtype != np.int64 or header[0] not in (READY, DATA):
            return "not a point-to-point message"
        kind, tag, n = (int(v) for v in header)
        key = (d.sender, tag, n)
        if kind == READY:
            if len(d.arrays) != 1:
                return "not a point-to-point message"
            if key in self._ready:
                return "a second READY for one receive"
            if self._promised[d.sender] >= MAX_READY:
                return f"more than {MAX_READY} receives ahead"
            self._ready.add(key)
            self._promised[d.sender] += 1
            self._wake((READY, *key))
            return None
        array = self._posted.get(key)
        if array is None or key in self._arrived:
            return "a message no receive asked for"
        if len(d.arrays) != 2 or d.arrays[1].shape != array.shape or d.arrays[1].dtype != array.dtype:
            shapes = ", ".join(f"{a.dtype}{list(a.shape)}" for a in d.arrays[1:])
            self._mismatched.setdefault(key, (time.monotonic(), shapes))
            return "shapes or dtypes of another receive"
        np.copyto(array, d.arrays[1])
        self._arrived.add(key)
        self._wake((DATA, *key))
        return None

    def _wake(self, key: tuple[int, int, int, int]) -> None:
        if (waiter := self._waiting.get(key)) is not None:
            waiter.set()


def _header(kind: int, tag: int, n: int) -> np.ndarray:
    return np.array([kind, tag, n], dtype=np.int64)
