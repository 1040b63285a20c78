"""Collectives over the engine, on numpy arrays: what the ``p2plearn`` process group runs.

Every collective is a few point-to-point exchanges of whole messages (`Channel.send` to each
receiver, `Channel.recv` filed by message id and sender). Collective number ``seq`` (the same on
every rank: ranks call collectives in the same order) sends its phase ``p`` as message id
``seq * PHASES + p``. One thread runs the collectives of a group, one after the other.

All-reduce of floats (SUM, AVG) is a reduce-scatter + all-gather, as partitioned rounds do
(`p2plearn.sync.partitioned`, whose layout it uses): the buffer, read as one sequence of elements,
is cut into one part per rank, sized by each rank's bandwidth, and every flow is paced; rank k averages part k (mask
-aware, in C: `merge_parameter`) and sends it to every other rank. With exact delivery (the
default, and always for every other collective) the result equals an all-reduce to float
rounding, the same on every rank. With loss bounds (the DDP comm hook's gradient buckets) a
part's element is averaged over the ranks whose chunk arrived, and an averaged chunk that did not
come back keeps the rank's own value: each element stays an average of some ranks' values, never a
zero, so its expectation over independent gradients is the mean gradient (unbiased).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from p2plearn.sync.merge import Contribution, merge_parameter
from p2plearn.selection import PACING_HEADROOM
from p2plearn.sync.partitioned import PartLayout
from p2plearn.tolerance import RoundRecord
from p2plearn.transport import Channel, Delivery, Reason, SendHandle
from p2plearn.transport.channel import PROBE_MSG_IDS

PHASES = 2                   # message ids per collective (all-reduce: scatter, gather)
SEQS = PROBE_MSG_IDS[0] // PHASES  # collective numbers (mod SEQS: ids stay below the channel's probe ids)
POLL_S = 0.2                 # longest recv wait, so a stalled collective notices its own timeout
GRACE_S = 0.5                # a lossy phase waits this much past its deadline for the sender's close
REDUCE = {"sum": np.add, "avg": np.add, "product": np.multiply, "min": np.minimum, "max": np.maximum}


class CollectiveTimeout(TimeoutError):
    """A lossless collective missed a rank's message within the group's timeout."""


class Mailbox:
    """Deliveries pulled off the channel, filed by (message id, sender) until a collective takes them."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._kept: dict[tuple[int, int], Delivery] = {}

    def collect(self, msg_id: int, senders: set[int], until: float) -> dict[int, Delivery]:
        """Message ``msg_id`` from each of ``senders`` that arrives by ``until`` (monotonic s).
        Messages of earlier collectives still kept (late ones of a lossy phase) are dropped."""
        self._kept = {key: d for key, d in self._kept.items() if key[0] >= msg_id}
        got = {s: self._kept.pop((msg_id, s)) for s in senders if (msg_id, s) in self._kept}
        while len(got) < len(senders):
            left = until - time.monotonic()
            if left <= 0:
                break
            d = self._channel.recv(timeout=min(left, POLL_S))
            if d is None:
                continue
            if d.msg_id == msg_id and d.sender in senders:
                got[d.sender] = d
            elif d.msg_id > msg_id:  # a faster rank's next collective
                self._kept[(d.msg_id, d.sender)] = d
        return got


class Links:
    """Each rank's uplink and downlink (bytes/s, > 0), as a view holds them (``alive``: all)."""

    def __init__(self, uplink: Sequence[float], downlink: Sequence[float]) -> None:
        self.uplink = np.asarray(uplink, dtype=float)
        self.downlink = np.asarray(downlink, dtype=float)
        self.alive = np.ones(len(self.uplink), dtype=bool)


class Collectives:
    """The collectives of one group of ``world_size`` ranks over ``channel``.

    ``engines``: rank -> (host, port) of its engine; ``links``: every rank's bandwidths, which size
    the all-reduce parts and pace every flow (at PACING_HEADROOM of its share of the sender's uplink
    and the receiver's downlink: the engine has no congestion control of its own, so an unpaced
    burst overflows a shallow switch queue); ``timeout``: seconds a lossless collective waits for a
    rank before it raises `CollectiveTimeout` naming it.
    """

    def __init__(self, channel: Channel, rank: int, world_size: int, engines: dict[int, tuple[str, int]],
                 links: Links, timeout: float) -> None:
        self.channel = channel
        self.rank = rank
        self.world_size = world_size
        self._engines = engines
        self.links = links
        self.timeout = timeout
        self.mailbox = Mailbox(channel)
        self.others = [r for r in range(world_size) if r != rank]
        self._layouts: dict[tuple[int, ...], PartLayout] = {}  # by the layers' sizes: DDP's buckets repeat

    # -- point to point ------------------------------------------------------------------------
    def _send(self, msg_id: int, arrays: list[np.ndarray], to: Sequence[int], bounds: float | Sequence[float] = 0.0,
              deadline: float | None = None, rates: dict[int, float] | None = None) -> SendHandle:
        """Send to ranks ``to``, each paced at ``rates[r]``, by default at an equal share of this
        uplink among them and of its downlink among the n - 1 ranks that may send to it at once."""
        if rates is None:
            up, down = self.links.uplink[self.rank] / max(len(to), 1), self.links.downlink / max(self.world_size - 1, 1)
            rates = {r: PACING_HEADROOM * min(up, down[r]) for r in to}
        return self.channel.send(msg_id, arrays, [(*self._engines[r], rates[r]) for r in to], loss_bounds=bounds,
                                 deadline=deadline)

    def _wait_sends(self, handles: list[SendHandle], deadline: float | None) -> list:
        limit = self.timeout if deadline is None else deadline + GRACE_S + self.timeout
        stats = []
        for h in handles:
            try:
                stats += h.wait(limit)
            except TimeoutError:
                raise CollectiveTimeout(f"p2plearn: a send to {h.receivers} was not acknowledged in {limit:.0f} s "
                                        f"(a rank died or hangs)") from None
        return stats

    def _receive(self, msg_id: int, senders: set[int], what: str, shapes: Callable[[int], list[np.ndarray]]
                 ) -> dict[int, list[np.ndarray]]:
        """Lossless: every sender's message, whole, with arrays shaped like ``shapes(sender)``."""
        got = self.mailbox.collect(msg_id, senders, time.monotonic() + self.timeout)
        late = sorted(senders - set(got))
        if late:
            raise CollectiveTimeout(f"p2plearn: {what}: no message from rank(s) {late} in {self.timeout:.0f} s")
        out = {}
        for s, d in got.items():
            expected = shapes(s)
            if d.reason != Reason.COMPLETE or not _fits(d, expected):
                raise RuntimeError(f"p2plearn: {what}: rank {s}'s message arrived {d.reason.name.lower()} or does not "
                                   f"match this rank's tensors (do all ranks call it with the same shapes and dtypes?)")
            out[s] = d.arrays
        return out

    # -- collectives ---------------------------------------------------------------------------
    def broadcast(self, seq: int, array: np.ndarray, root: int) -> None:
        msg = seq * PHASES
        if self.rank == root:
            if self.others:
                self._wait_sends([self._send(msg, [array], self.others)], None)
            return
        np.copyto(array, self._receive(msg, {root}, "broadcast", lambda _: [array])[root][0])

    def allgather(self, seq: int, array: np.ndarray, outputs: list[np.ndarray]) -> None:
        msg = seq * PHASES
        handle = self._send(msg, [array], self.others) if self.others else None
        np.copyto(outputs[self.rank], array)
        for s, arrays in self._receive(msg, set(self.others), "all_gather", lambda s: [outputs[s]]).items():
            np.copyto(outputs[s], arrays[0])
        if handle is not None:
            self._wait_sends([handle], None)

    def gather(self, seq: int, array: np.ndarray, outputs: list[np.ndarray] | None, root: int) -> None:
        msg = seq * PHASES
        if self.rank != root:
            self._wait_sends([self._send(msg, [array], [root])], None)
            return
        assert outputs is not None
        np.copyto(outputs[root], array)
        for s, arrays in self._receive(msg, set(self.others), "gather", lambda s: [outputs[s]]).items():
            np.copyto(outputs[s], arrays[0])

    def scatter(self, seq: int, inputs: list[np.ndarray] | None, output: np.ndarray, root: int) -> None:
        msg = seq * PHASES
        if self.rank == root:
            assert inputs is not None
            handles = [self._send(msg, [inputs[r]], [r]) for r in self.others]
            np.copyto(output, inputs[root])
            self._wait_sends(handles, None)
            return
        np.copyto(output, self._receive(msg, {root}, "scatter", lambda _: [output])[root][0])

    def reduce_scatter(self, seq: int, inputs: list[np.ndarray], output: np.ndarray, op: str) -> None:
        msg = seq * PHASES
        handles = [self._send(msg, [inputs[r]], [r]) for r in self.others]
        got = self._receive(msg, set(self.others), "reduce_scatter", lambda _: [output])
        values = [inputs[self.rank] if r == self.rank else got[r][0] for r in range(self.world_size)]
        _reduce(output, values, op, self.world_size)
        self._wait_sends(handles, None)

    def barrier(self, seq: int) -> None:
        token = np.zeros(1, dtype=np.uint8)
        self.allgather(seq, token, [np.zeros(1, dtype=np.uint8) for _ in range(self.world_size)])

    def allreduce(self, seq: int, layers: list[np.ndarray], op: str, bounds: Sequence[float] | None = None,
                  deadline: float | None = None) -> RoundRecord:
        """Reduce ``layers`` (1-d views, in order, of one buffer) across the ranks, in place.

        Floats under SUM or AVG go through reduce-scatter + all-gather; ``bounds`` (per layer)
        and ``deadline`` (s, per phase) make it lossy (see the module's docstring). Other ops
        and dtypes are exact, through the same two phases. Returns what the round measured.
        """
        t0 = time.monotonic()
        lossy = bounds is not None and (deadline is not None or any(b > 0 for b in bounds))
        if lossy and not (layers[0].dtype.kind == "f" and op in ("sum", "avg")):
            raise ValueError("p2plearn: loss bounds apply to SUM/AVG all-reduces of floats only")
        bounds = list(bounds) if bounds is not None else [0.0] * len(layers)
        sizes = tuple(a.size for a in layers)
        if sizes not in self._layouts:
            self._layouts[sizes] = PartLayout.from_view(self.links, list(sizes), sum(a.nbytes for a in layers))
        layout = self._layouts[sizes]
        slices = layout.slices
        mean_merge = layers[0].dtype.kind == "f" and op in ("sum", "avg")

        def pieces(r: int) -> list[np.ndarray]:
            return [layers[t][a:b] for t, a, b in slices[r]]

        def piece_bounds(r: int) -> list[float]:
            return [bounds[t] for t, _, _ in slices[r]]

        # 1. scatter: part k to rank k
        scatter_id, gather_id = seq * PHASES, seq * PHASES + 1
        aggregators = [r for r in self.others if slices[r]]
        scatter = [self._send(scatter_id, pieces(r), [r], piece_bounds(r), deadline, layout.scatter_rate[self.rank])
                   for r in aggregators]
        mine = pieces(self.rank)
        delivered = []
        if mine and self.others:
            senders = set(self.others)
            if lossy:
                until = t0 + (deadline if deadline is not None else self.timeout) + GRACE_S
                got = self.mailbox.collect(scatter_id, senders, until)
                usable = {s: d for s, d in got.items() if _fits(d, mine)}
                for i, own in enumerate(mine):
                    merge_parameter(own, [Contribution(d.arrays[i], chunks=d.chunks(i)) for d in usable.values()])
                delivered.append(sum(d.delivered for d in usable.values()) / len(senders))
            else:
                got = self._receive(scatter_id, senders, "all_reduce", lambda _: mine)
                for i, own in enumerate(mine):
                    if mean_merge:
                        merge_parameter(own, [Contribution(arrays[i]) for arrays in got.values()])
                    else:
                        values = [own.copy() if r == self.rank else got[r][i] for r in range(self.world_size)]
                        _reduce(own, values, op, self.world_size)
        # 2. gather: this rank's reduced part to every other rank; theirs into place where it arrived
        gather = self._send(gather_id, mine, self.others, piece_bounds(self.rank), deadline,
                            layout.gather_rate[self.rank]) if mine and self.others else None
        stats = self._wait_sends(scatter, deadline)  # they read the parts about to be overwritten
        senders = set(aggregators)
        if lossy:
            until = time.monotonic() + (deadline if deadline is not None else self.timeout) + GRACE_S
            got = self.mailbox.collect(gather_id, senders, until)
            for s, d in got.items():
                theirs = pieces(s)
                if not _fits(d, theirs):
                    continue
                for i, own in enumerate(theirs):
                    np.copyto(own, d.arrays[i], where=d.element_mask(i))
                delivered.append(d.delivered)
            delivered += [0.0] * len(senders - set(got))
        elif senders:
            for s, arrays in self._receive(gather_id, senders, "all_reduce", pieces).items():
                for own, value in zip(pieces(s), arrays):
                    np.copyto(own, value)
        if gather is not None:
            stats += self._wait_sends([gather], deadline)
        if mean_merge and op == "sum":  # every element holds a mean: the sum over all ranks is n times it
            for a in layers:
                a *= self.world_size
        elapsed = time.monotonic() - t0
        return RoundRecord(round=seq, elapsed_s=elapsed,
                           delivered=float(np.mean([st.delivered for st in stats])) if stats else 1.0,
                           loss_rate=float(np.mean([st.loss_rate for st in stats])) if stats else 0.0,
                           delivery_rates=[st.delivery_rate for st in stats],
                           deadline_hit=any(st.result == "deadline" for st in stats),
                           message_bytes=sum(a.nbytes for a in layers) // max(self.world_size, 1))


def _fits(d: Delivery, expected: list[np.ndarray]) -> bool:
    """Whether the message's arrays have the shapes and dtypes of ``expected``."""
    return d.arrays is not None and len(d.arrays) == len(expected) and all(
        a.shape == e.shape and a.dtype == e.dtype for a, e in zip(d.arrays, expected))


def _reduce(out: np.ndarray, values: list[np.ndarray], op: str, world_size: int) -> None:
    """``out`` = op over ``values`` (in rank order, so every rank computes the same)."""
    ufunc = REDUCE[op]
    result = values[0].copy()
    for v in values[1:]:
        ufunc(result, v, out=result)
    if op == "avg":
        result = result / world_size if result.dtype.kind == "f" else result // world_size
    np.copyto(out, result, casting="unsafe")
