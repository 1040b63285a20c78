"""`Sender`: whole messages from this rank of a group to others, over one engine, paced and waited
for with the group's failures in mind; what collectives and point-to-point operations both send with.

Errors are `CollectiveError` (a ``torch.distributed.DistBackendError``, as gloo's are) naming the
op, the rank(s) and the reason; `CollectiveTimeout` when a rank said nothing within the group's
timeout.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch.distributed as dist

from p2plearn.selection import PACING_HEADROOM
from p2plearn.transport import Channel, ReceiverStats, SendHandle, message_bytes

POLL_S = 0.2                 # longest wait on the engine, so a stalled operation notices its own timeout
GRACE_S = 0.5                # a lossy phase waits this much past its deadline for the sender's close


class CollectiveError(dist.DistBackendError):
    """A collective could not complete: the message names the op, the rank(s) and why."""


class CollectiveTimeout(CollectiveError):
    """A lossless collective missed a rank's message within the group's timeout."""


def check_departed(what: str, ranks: Iterable[int], departed: Mapping[int, str]) -> None:
    """Raise naming every one of ``ranks`` that is no longer in the job, and why."""
    gone = sorted(r for r in ranks if r in departed)
    if gone:
        raise CollectiveError(f"p2plearn: {what}: " + "; ".join(f"rank {r} {departed[r]}" for r in gone))


class Links:
    """Each rank's uplink and downlink (bytes/s, > 0), as a view holds them (``alive``: all; no
    noise: they are given, not measured)."""

    def __init__(self, uplink: Sequence[float], downlink: Sequence[float]) -> None:
        self.uplink = np.asarray(uplink, dtype=float)
        self.downlink = np.asarray(downlink, dtype=float)
        self.alive = np.ones(len(self.uplink), dtype=bool)
        self.uplink_noise = self.downlink_noise = np.zeros(len(self.uplink))


class Sender:
    """This rank's sends to the other ranks of a group of ``world_size`` over ``channel``.

    ``engines``: rank -> (host, port) of its engine; ``links``: every rank's bandwidths, which pace
    every flow (at PACING_HEADROOM of its share of the sender's uplink and the receiver's downlink:
    the engine has no congestion control of its own, so an unpaced burst overflows a shallow switch
    queue); ``timeout``: seconds a send waits for its acknowledgements; ``departed``: rank -> why it
    is no longer in the job (the group's membership fills it; this rank's own entry fails every
    wait); ``max_message_bytes``: the largest message (the engines' limit: a larger one raises at
    once on every rank instead of being refused by the receiver's engine).
    """

    def __init__(self, channel: Channel, rank: int, world_size: int, engines: dict[int, tuple[str, int]],
                 links: Links, timeout: float, departed: Mapping[int, str],
                 max_message_bytes: int | None = None) -> None:
        self.channel = channel
        self.rank = rank
        self.world_size = world_size
        self.engines = engines
        self._ranks = {(socket.gethostbyname(host), port): r for r, (host, port) in engines.items()}  # a send's receivers
        self.links = links
        self.timeout = timeout
        self.departed = departed
        self.max_message_bytes = max_message_bytes

    def check_size(self, arrays: list[np.ndarray], what: str) -> None:
        """Raise before sending or waiting for a message over the group's limit (every rank of a
        collective computes the same sizes, so all of them raise)."""
        size = message_bytes(arrays)
        if self.max_message_bytes is not None and size > self.max_message_bytes:
            raise CollectiveError(f"p2plearn: {what}: a message of {size / 2**20:.1f} MiB is over the group's limit of "
                                  f"{self.max_message_bytes / 2**20:.1f} MiB: raise P2PLEARN_MAX_MESSAGE_MB on every rank")

    def send(self, msg_id: int, arrays: list[np.ndarray], to: Sequence[int], what: str,
             bounds: float | Sequence[float] = 0.0, deadline: float | None = None,
             rates: dict[int, float] | None = None) -> SendHandle:
        """Send to ranks ``to``, each paced at ``rates[r]``, by default at an equal share of this
        uplink among them and of its downlink among the n - 1 ranks that may send to it at once."""
        self.check_size(arrays, what)
        check_departed(what, to, self.departed)
        if rates is None:
            up, down = self.links.uplink[self.rank] / max(len(to), 1), self.links.downlink / max(self.world_size - 1, 1)
            rates = {r: PACING_HEADROOM * min(up, down[r]) for r in to}
        return self.channel.send(msg_id, arrays, [(*self.engines[r], rates[r]) for r in to], loss_bounds=bounds,
                                 deadline=deadline)

    def wait(self, handles: list[SendHandle], deadline: float | None, what: str) -> list[ReceiverStats]:
        """Every send's per-receiver stats, once done. Raises when a receiver departed, stopped
        acknowledging before it had the whole message, or the sends outlast their limit."""
        end = time.monotonic() + (self.timeout if deadline is None else deadline + GRACE_S + self.timeout)
        stats = []
        for h in handles:
            receivers = [self._ranks[(host, port)] for host, port, _ in h.receivers]
            # a receiver that departed is not judged here: it may have had the whole message (the end
            # of a job); its engine's silence ends the send within 3 s, and the result says
            while not h.done():
                check_departed(what, [self.rank], self.departed)
                left = end - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeout(f"p2plearn: {what}: a send to rank(s) {receivers} was not acknowledged in "
                                            f"{self.timeout:.0f} s (a rank died or hangs)")
                try:
                    h.wait(min(left, POLL_S))
                except TimeoutError:
                    pass
            for r, st in zip(receivers, h.wait()):
                if st.result in ("unreachable", "cancelled") and st.delivered < 1.0:
                    check_departed(what, [r], self.departed)  # the likelier cause, named as such
                    raise CollectiveError(f"p2plearn: {what}: rank {r} stopped acknowledging this rank's message "
                                          f"({st.result}{': ' + st.error if st.error else ''}; "
                                          f"{st.delivered:.0%} of it arrived)")
                stats.append(st)
        return stats
