"""Collectives over the engine, on numpy arrays: what the ``p2plearn`` process group runs.

Every collective is a few point-to-point exchanges of whole messages (`Channel.send` to each
receiver, `Channel.recv` filed by message id and sender). Collective number ``seq`` (the same on
every rank: ranks call collectives in the same order) sends its phase ``p`` as message id
``seq * PHASES + p``. One thread runs the collectives of a group, one after the other.

All-reduce of floats (SUM, AVG) is a reduce-scatter + all-gather, the partitioned round of
training (`p2plearn.sync.exchange.PartExchange` computes it, `p2plearn.sync.layout` cuts it): the
buffer, read as one sequence of elements, is cut into one part per rank, sized by each rank's
bandwidth, and every flow is paced; rank k averages part k (mask-aware, in C) and sends it to every
other rank. With exact delivery (the
default, and always for every other collective) the result equals an all-reduce to float
rounding, the same on every rank. With loss bounds (the DDP comm hook's gradient buckets) a
part's element is averaged over the ranks whose chunk arrived, and an averaged chunk that did not
come back keeps the rank's own value: each element stays an average of some ranks' values, never a
zero, so its expectation over independent gradients is the mean gradient (unbiased).

Failures raise `CollectiveError` (a ``torch.distributed.DistBackendError``, as gloo's do) naming
the op, the rank(s) and the reason: a rank that left the job or was declared dead by it (within
the control plane's detection time, ~1-2 s), a send a rank stopped acknowledging, a rank whose
message does not match this rank's tensors, a message larger than the group's limit, the group's
timeout. Messages wait in training's `p2plearn.sync.inbox.Inbox`, in a window of AHEAD collectives
(ids wrap around), at most CANDIDATES per id and sender and ``kept_bytes`` per sender. A message is
taken only by the collective of its id, from its sender, with this rank's shapes and dtypes; any
other is refused and counted (the group's ``stats()``: ``mailbox.refused``), so a key holder's
forged messages cannot make a collective take the wrong data or desynchronise the group.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from p2plearn.distributed.sender import (GRACE_S, POLL_S, CollectiveError, CollectiveTimeout, Links, Sender,
                                         check_departed)
from p2plearn.sync.exchange import PartExchange, PartReduce, reduce_exact
from p2plearn.sync.inbox import Inbox
from p2plearn.sync.kept import KeptMessages
from p2plearn.sync.layout import PartLayout
from p2plearn.sync.merge import Contribution
from p2plearn.tolerance import RoundRecord
from p2plearn.transport import Channel, Delivery, Reason
from p2plearn.transport.channel import PROBE_MSG_IDS

PHASES = 2                   # message ids per collective (all-reduce: scatter, gather)
SEQS = PROBE_MSG_IDS[0] // PHASES  # collective numbers (mod SEQS: ids stay below the channel's probe ids)
IDS = SEQS * PHASES          # message ids of collectives; they wrap around after IDS
AHEAD = 16                   # collectives of a faster rank whose messages are kept until this rank runs them
CANDIDATES = 4               # messages kept per (message id, sender) until their collective checks their shapes
LAYOUT_LOST = "ended before its layout arrived"  # at its sender's deadline or silence, its first datagrams
                                                 # lost: nothing usable, and no sign of another collective
MISMATCH_S = 10.0            # how long a collective still waits for a rank's fitting message after refusing
                             # one of other shapes in its name (a forgery, unless the rank's own tensors differ)

log = logging.getLogger("p2plearn.distributed")


Fits = Callable[[int, Delivery], bool]  # whether a delivery from a sender is what the collective expects
Took = Callable[[int, Delivery], object]  # told of each delivery that fits, as it arrives


def _shapes(d: Delivery) -> str:
    return "none" if d.arrays is None else ", ".join(f"{a.dtype}{list(a.shape)}" for a in d.arrays)


class Collectives:
    """The collectives of one group of ``world_size`` ranks over ``channel``.

    ``engines``, ``links``, ``departed`` and ``max_message_bytes`` are the `Sender`'s (the links
    also size the all-reduce parts); ``timeout``: seconds a lossless collective waits for a rank
    before it raises `CollectiveTimeout` naming it; ``kept_bytes``: the bytes of messages kept
    ahead per sender (the inbox's quota).
    """

    def __init__(self, channel: Channel, rank: int, world_size: int, engines: dict[int, tuple[str, int]],
                 links: Links, timeout: float, departed: Mapping[int, str] | None = None,
                 max_message_bytes: int | None = None, kept_bytes: int = 1 << 30) -> None:
        self.channel = channel
        self.rank = rank
        self.world_size = world_size
        self.links = links
        self.timeout = timeout
        self.departed: Mapping[int, str] = {} if departed is None else departed
        self.sender = Sender(channel, rank, world_size, engines, links, timeout, self.departed, max_message_bytes)
        self._current = 0  # the message id being collected: the inbox's window starts there
        self.mailbox = Inbox(channel, lambda: (self._current, self._current + AHEAD * PHASES), ids=IDS, state_flag=0,
                             kept=KeptMessages(CANDIDATES, kept_bytes, replace=False), admit=self._admit,
                             beyond=f"more than {AHEAD} collectives ahead", warn=self._warn)
        self.others = [r for r in range(world_size) if r != rank]
        self._layouts: dict[tuple[int, ...], PartLayout] = {}  # by the layers' sizes: DDP's buckets repeat

    def _admit(self, d: Delivery) -> str | None:
        """Why a delivery is no message of this group's collectives (None: it may be)."""
        if not (0 <= d.sender < self.world_size) or d.sender == self.rank or d.msg_id >= IDS:
            return "not a collective of this group"
        return None

    def _warn(self, reason: str, sender: int) -> None:
        if reason == LAYOUT_LOST:  # the link's loss, not a member's forgery or bug: counted only
            return
        log.warning("p2plearn: rank %d refused a message in the name of rank %d: %s (counted in the group's stats())",
                    self.rank, sender, reason)

    def _collect(self, msg_id: int, senders: set[int], fits: Fits, until: float, what: str,
                 took: Took | None = None, idle: Callable[[], object] | None = None) -> dict[int, Delivery]:
        """Message ``msg_id`` from each of ``senders`` that fits and arrives by ``until``
        (monotonic s), each also handed to ``took`` as it arrives; ``idle`` is called after each
        poll that brought nothing. Raises CollectiveError when one of them departed
        (``self.departed``) or, MISMATCH_S after refusing a message of other shapes in its name,
        sent none that fits."""
        check_departed(what, [self.rank], self.departed)
        self._current = msg_id
        got: dict[int, Delivery] = {}
        mismatched: dict[int, tuple[float, Delivery]] = {}  # sender -> (when, its first refused message)

        def offer(d: Delivery) -> bool:
            """Take a message of this collective (the inbox files the others)."""
            if d.msg_id != msg_id:
                return False
            if d.sender not in senders:
                self.mailbox.drop("a sender this collective does not wait for", d.sender)
            elif d.sender in got:
                self.mailbox.drop("a second message for one collective", d.sender)
            elif d.arrays is None:  # (the link's loss: not judged as a message of other shapes)
                self.mailbox.drop(LAYOUT_LOST, d.sender)
            elif fits(d.sender, d):
                got[d.sender] = d
                if took is not None:
                    took(d.sender, d)
            else:
                self.mailbox.drop("shapes or dtypes of another collective", d.sender)
                mismatched.setdefault(d.sender, (time.monotonic(), d))
            return True

        for d in self.mailbox.take(msg_id, msg_id):  # kept while this rank was behind; earlier ones are late
            offer(d)
        while len(got) < len(senders):
            now = time.monotonic()
            if any(s in self.departed for s in senders - set(got)):
                # a rank that sent its message and then left (the end of a job) is not missing it:
                # take what the engine already delivered before judging
                while len(got) < len(senders) and self.mailbox.pump(0.0, offer):
                    pass
                check_departed(what, senders - set(got), self.departed)
            for s, (since, d) in mismatched.items():
                if s not in got and now >= since + MISMATCH_S:
                    raise CollectiveError(f"p2plearn: {what}: rank {s}'s message has shapes {_shapes(d)} "
                                          f"({d.reason.name.lower()}), not this rank's: do all ranks call it with the "
                                          f"same shapes and dtypes?")
            left = until - now
            if left <= 0:
                break
            if not self.mailbox.pump(min(left, POLL_S), offer) and idle is not None:
                idle()
        return got

    def _receive(self, msg_id: int, senders: set[int], what: str, shapes: Callable[[int], list[np.ndarray]],
                 took: Took | None = None, idle: Callable[[], object] | None = None) -> dict[int, list[np.ndarray]]:
        """Lossless: every sender's message, whole, with arrays shaped like ``shapes(sender)`` (each
        also handed to ``took`` as it arrives; ``idle`` as `_collect`'s)."""
        for s in senders:
            self.sender.check_size(shapes(s), what)
        got = self._collect(msg_id, senders, lambda s, d: d.reason == Reason.COMPLETE and _fits(d, shapes(s)),
                            time.monotonic() + self.timeout, what, took, idle)
        late = sorted(senders - set(got))
        if late:
            raise CollectiveTimeout(f"p2plearn: {what}: no message from rank(s) {late} in {self.timeout:.0f} s")
        return {s: d.arrays for s, d in got.items()}

    # -- collectives ---------------------------------------------------------------------------
    def broadcast(self, seq: int, array: np.ndarray, root: int) -> None:
        msg, what = seq * PHASES, f"broadcast #{seq} from rank {root}"
        if self.rank == root:
            if self.others:
                self.sender.wait([self.sender.send(msg, [array], self.others, what)], None, what)
            return
        np.copyto(array, self._receive(msg, {root}, what, lambda _: [array])[root][0])

    def allgather(self, seq: int, array: np.ndarray, outputs: list[np.ndarray]) -> None:
        msg, what = seq * PHASES, f"all_gather #{seq}"
        handle = self.sender.send(msg, [array], self.others, what) if self.others else None
        np.copyto(outputs[self.rank], array)
        for s, arrays in self._receive(msg, set(self.others), what, lambda s: [outputs[s]]).items():
            np.copyto(outputs[s], arrays[0])
        if handle is not None:
            self.sender.wait([handle], None, what)

    def gather(self, seq: int, array: np.ndarray, outputs: list[np.ndarray] | None, root: int) -> None:
        msg, what = seq * PHASES, f"gather #{seq} to rank {root}"
        if self.rank != root:
            self.sender.wait([self.sender.send(msg, [array], [root], what)], None, what)
            return
        assert outputs is not None
        np.copyto(outputs[root], array)
        for s, arrays in self._receive(msg, set(self.others), what, lambda s: [outputs[s]]).items():
            np.copyto(outputs[s], arrays[0])

    def scatter(self, seq: int, inputs: list[np.ndarray] | None, output: np.ndarray, root: int) -> None:
        msg, what = seq * PHASES, f"scatter #{seq} from rank {root}"
        if self.rank == root:
            assert inputs is not None
            handles = [self.sender.send(msg, [inputs[r]], [r], what) for r in self.others]
            np.copyto(output, inputs[root])
            self.sender.wait(handles, None, what)
            return
        np.copyto(output, self._receive(msg, {root}, what, lambda _: [output])[root][0])

    def _exchange(self, msg: int, inputs: list[np.ndarray], expected: list[np.ndarray], what: str,
                  took: Took) -> None:
        """Send ``inputs[r]`` to each other rank r and hand each rank s's message, shaped like
        ``expected[s]``, to ``took`` as it arrives."""
        handles = [self.sender.send(msg, [inputs[r]], [r], what) for r in self.others]
        self._receive(msg, set(self.others), what, lambda s: [expected[s]], took)
        self.sender.wait(handles, None, what)

    def all_to_all(self, seq: int, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        """``outputs[s]`` = rank s's ``inputs[self.rank]`` (each pair of ranks agrees on that
        piece's shape; a zero-size piece is sent as such)."""
        np.copyto(outputs[self.rank], inputs[self.rank])
        self._exchange(seq * PHASES, inputs, outputs, f"all_to_all #{seq}",
                       lambda s, d: np.copyto(outputs[s], d.arrays[0]))

    def reduce_scatter(self, seq: int, inputs: list[np.ndarray], output: np.ndarray, op: str) -> None:
        values = [inputs[self.rank]] * self.world_size  # every rank's piece for this one

        def took(s: int, d: Delivery) -> None:
            values[s] = d.arrays[0]

        self._exchange(seq * PHASES, inputs, [output] * self.world_size, f"reduce_scatter #{seq}", took)
        reduce_exact(output, values, op)

    def barrier(self, seq: int) -> None:
        token = np.zeros(1, dtype=np.uint8)
        self.allgather(seq, token, [np.zeros(1, dtype=np.uint8) for _ in range(self.world_size)])

    def allreduce(self, seq: int, layers: list[np.ndarray], op: str, bounds: Sequence[float] | None = None,
                  deadline: float | None = None, root: int | None = None) -> RoundRecord:
        """Reduce ``layers`` (1-d views, in order, of one buffer) across the ranks, in place.

        Floats under SUM or AVG go through reduce-scatter + all-gather; ``bounds`` (per layer)
        and ``deadline`` (s, per phase) make it lossy (see the module's docstring). Other ops
        and dtypes are exact, through the same two phases. With ``root`` (a reduce) the reduced
        parts are gathered to that rank alone: the others' layers end holding their own part
        reduced. Returns what the round measured.
        """
        t0 = time.monotonic()
        what = f"all_reduce #{seq}" if root is None else f"reduce #{seq} to rank {root}"
        lossy = bounds is not None and (deadline is not None or any(b > 0 for b in bounds))
        if lossy and not (layers[0].dtype.kind == "f" and op in ("sum", "avg")):
            raise ValueError("p2plearn: loss bounds apply to SUM/AVG all-reduces of floats only")
        bounds = list(bounds) if bounds is not None else [0.0] * len(layers)
        sizes = tuple(a.size for a in layers)
        if sizes not in self._layouts:
            self._layouts[sizes] = PartLayout.from_view(self.links, list(sizes), sum(a.nbytes for a in layers))
        layout = self._layouts[sizes]
        slices = layout.slices
        exchange = PartExchange(layers)
        # floats under SUM or AVG: the mask-aware mean (SUM: times n); anything else exact, bfloat16
        # bits too (reduced in float32 and rounded once: the mean's rounding, times n, would round twice)
        reduction = "mean" if layers[0].dtype.kind == "f" and op in ("sum", "avg") else op

        def piece_bounds(r: int) -> list[float]:
            return [bounds[t] for t, _, _ in slices[r]]

        def collect(msg_id: int, senders: set[int], start: float, reduction: PartReduce | None = None
                    ) -> dict[int, list[Contribution]]:
            """Each sender's contributions to its pieces (this rank's part in the scatter, the
            sender's part in the gather): lossy, whatever arrived by the deadline; else whole.
            With ``reduction``, offered to it as they arrive instead (folded while the wait is idle)."""
            part = (lambda s: slices[self.rank]) if msg_id == scatter_id else (lambda s: slices[s])

            def contributions(s: int, d: Delivery) -> list[Contribution] | None:
                return exchange.contributions(d, part(s), None) if lossy else [Contribution(a) for a in d.arrays]

            offer = None if reduction is None else (lambda s, d: reduction.offer(s, contributions(s, d)))
            idle = None if reduction is None else reduction.fold_due
            if not lossy:
                got = self._receive(msg_id, senders, what, lambda s: exchange.pieces(part(s)), offer, idle)
                return {s: [Contribution(a) for a in arrays] for s, arrays in got.items()}
            until = start + (deadline if deadline is not None else self.timeout) + GRACE_S
            got = self._collect(msg_id, senders, lambda s, d: contributions(s, d) is not None, until, what, offer,
                                idle)
            return {s: contributions(s, d) for s, d in got.items()}

        # 1. scatter: part k to rank k
        scatter_id, gather_id = seq * PHASES, seq * PHASES + 1
        aggregators = [r for r in self.others if slices[r]]
        scatter = [self.sender.send(scatter_id, exchange.scatter(slices[r]), [r], what, piece_bounds(r), deadline,
                                    layout.scatter_rate[self.rank]) for r in aggregators]
        mine = slices[self.rank]
        if mine and self.others and reduction == "mean":  # folded as the parts arrive, while the wait is idle
            part_reduce = exchange.begin(mine, self.others)
            collect(scatter_id, set(self.others), t0, part_reduce)
            part_reduce.finish()
        elif mine and self.others:
            exchange.reduce(mine, collect(scatter_id, set(self.others), t0), op=reduction, rank=self.rank)
        # SUM of floats: every element holds a mean and the sum over all ranks is n times it; each
        # aggregator scales its own part before the gather (not every rank the whole buffer after)
        times = self.world_size if reduction == "mean" and op == "sum" else 1
        if times != 1:
            for piece in exchange.pieces(mine):
                piece *= times
        # 2. gather: this rank's reduced part to every other rank (or the root); theirs into place where it arrived
        receivers = self.others if root is None else [r for r in [root] if r != self.rank]
        gather = self.sender.send(gather_id, exchange.pieces(mine), receivers, what, piece_bounds(self.rank),
                                  deadline, layout.gather_rate[self.rank]) if mine and receivers else None
        stats = self.sender.wait(scatter, deadline, what)  # they read the parts about to be overwritten
        if root is not None and root != self.rank:
            aggregators = []  # this rank gathers nothing
        gathered = collect(gather_id, set(aggregators), time.monotonic())
        for s in aggregators:  # a lost part keeps this rank's own value: under SUM, n times it
            if s in gathered:
                exchange.place(slices[s], gathered[s], None, lost_times=times)
            elif times != 1:
                for piece in exchange.pieces(slices[s]):
                    piece *= times
        if gather is not None:
            stats += self.sender.wait([gather], deadline, what)
        return RoundRecord.of_sends(seq, time.monotonic() - t0, stats,
                                    sum(a.nbytes for a in layers) // max(self.world_size, 1))


def _fits(d: Delivery, expected: list[np.ndarray]) -> bool:
    """Whether the message's arrays have the shapes and dtypes of ``expected``."""
    return d.arrays is not None and len(d.arrays) == len(expected) and all(
        a.shape == e.shape and a.dtype == e.dtype for a, e in zip(d.arrays, expected))
