"""A send's caller-side view: `SendHandle`, returned by `Channel.send`, and `ReceiverStats`, how the
send to each receiver went (`SendHandle.wait`; `TcpChannel` reports in the same terms), and
`_receiver_tuple`, a receiver as both channels take it, checked."""
from __future__ import annotations

import errno
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from p2plearn.transport._native import check, ffi, lib

SEND_RESULTS = {
    lib.P2P_SEND_EXACT: "exact",
    lib.P2P_SEND_EARLY_CLOSED: "early_closed",
    lib.P2P_SEND_DEADLINE: "deadline",
    lib.P2P_SEND_UNREACHABLE: "unreachable",
    lib.P2P_SEND_CANCELLED: "cancelled",
    lib.P2P_SEND_DUPLICATE: "duplicate",
    lib.P2P_SEND_SLOW: "slow",
}


@dataclass
class ReceiverStats:
    """How the send to one receiver went; `ack_rate`, `loss_rate` and the pacing rate feed the view's
    bandwidth estimates (see `p2plearn.control.estimator`)."""

    receiver: tuple[str, int]
    result: str
    fractions: list[float]      # per array, fraction acknowledged
    delivered: float            # fraction of all chunks acknowledged
    datagrams_sent: int
    retransmitted: int
    datagrams_received: int
    passes: int
    elapsed_s: float
    delivery_rate: float        # bytes/s that reached the receiver, every pass, over the whole send
    ack_rate: float             # wire bytes/s arriving in the first pass, from ACK spread (0: too few ACKs);
                                # result "slow": the rate up to the close, what it was closed on
    loss_rate: float
    rtt_s: float
    error: str = ""            # why the kernel refused to send there (result "unreachable"), e.g. "EACCES: Permission denied"
    multicast: bool = False    # the data reached it through this sender's multicast group


def _receiver_tuple(r: Any) -> tuple[str, int, float]:
    host, port, *rest = r
    rate = float(rest[0]) if rest else 0.0
    host = socket.gethostbyname(host)
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"receiver {r!r}: port must be in 1..65535")
    if rate < 0:
        raise ValueError(f"receiver {r!r}: rate must be >= 0 bytes/s")
    return host, port, rate


class SendHandle:
    """A send in flight. Keeps the arrays alive until the engine is done with them."""

    def __init__(self, ptr: Any, arrays: list[np.ndarray], receivers: list[tuple[str, int, float]], keep: list[Any]):
        self._ptr = ffi.gc(ptr, lib.p2p_send_release)
        self._arrays = arrays
        self._keep = keep
        self.receivers = receivers
        self._stats: list[ReceiverStats] | None = None
        self._lock = threading.Lock()

    def done(self) -> bool:
        return lib.p2p_send_wait(self._ptr, 0) == 0

    def wait(self, timeout: float | None = None) -> list[ReceiverStats]:
        """Block until every receiver finished (closed, exact, deadline, slow or unreachable); per-receiver stats.

        Raises TimeoutError if `timeout` seconds pass first.
        """
        with self._lock:
            if self._stats is None:
                ms = -1 if timeout is None else max(0, int(timeout * 1000))
                if lib.p2p_send_wait(self._ptr, ms) != 0:
                    raise TimeoutError(f"send not finished after {timeout} s")
                self._stats = [self._receiver_stats(i) for i in range(len(self.receivers))]
                self._arrays = self._keep = []  # the engine no longer reads them
            return self._stats

    def _receiver_stats(self, i: int) -> ReceiverStats:
        st = ffi.new("p2p_receiver_stats *")
        n = len(self._arrays)
        fr = ffi.new("double[]", max(n, 1))
        check(lib.p2p_send_receiver_stats(self._ptr, i, st, fr if n else ffi.NULL, n))
        host, port, _ = self.receivers[i]
        return ReceiverStats(
            receiver=(host, port), result=SEND_RESULTS.get(st.result, str(st.result)),
            fractions=[fr[j] for j in range(n)], delivered=st.delivered, datagrams_sent=st.datagrams_sent,
            retransmitted=st.datagrams_retransmitted, datagrams_received=st.datagrams_received,
            passes=st.passes, elapsed_s=st.elapsed_s, delivery_rate=st.delivery_rate, ack_rate=st.ack_rate,
            loss_rate=st.loss_rate, rtt_s=st.rtt_s,
            error=f"{errno.errorcode.get(st.error, st.error)}: {os.strerror(st.error)}" if st.error else "",
            multicast=bool(st.multicast))
