"""Virtual peers' messages with `--compress` or `--filter value`: what each sends, what it costs on the
simulated network, and what a receiver merges of it.

    messages = Messages.of(options, replicas.sizes, n, message_bytes, replica_bytes, rows, staleness)
    sizes = messages.encode(rnd, rows)                  # every peer's message of round rnd; its bytes on the network
    d = messages.delivery(rnd, sender, delivered, rng)  # what a receiver gets when `delivered` of it arrived
    messages.merge(row, [d, ...])                       # the receiver's C merge, in place
    messages.merged(rows)                               # after the round's merges (and outer steps)

`Messages.of` returns None for a plain run (every value as float32: the simulator's own, faster path).
Each virtual peer has what a real peer's `Synchronizer` builds, and encodes and reads its messages with
training's codec (`sync.codec.MessageCodec`, over the replica as one bucket, its tensors the layers):
- `--compress fp16|bf16|int8|int4`: its own `sync.compress.Compressor`, with its residuals (error
  feedback); a message is the compressor's arrays (values, then the int8/int4 scales);
- `--filter value`: its own `ValueFilter`, built from the options as `p2plearn.train` builds it, fed the
  change of the replica since its last merge, per layer (tensor); a message is the filter's header,
  indices and the current values of what passed: a receiver averages only the elements that travelled.
A message's bytes on the network are its arrays' bytes times message_bytes / replica_bytes, so a small
replica standing for a large model (`--message-bytes`) keeps the format's ratio.

What arrives: the arrays are laid out as the engine lays out segments (8-byte aligned, one after
another), cut into as many chunks as the message's bytes on the network fill datagrams (at least 8
bytes each); of a flow's `delivered` fraction, the missing chunks are drawn at random among the chunks
that carry only values, which the engine lets lose (the scales, the filter's header and indices have
loss bound 0 and are repaired first); only a message that lost more than its values' chunks (a
deadline) loses some of those, which costs what it costs a real receiver (a block without its scale,
a message without its header: dropped). Not modelled: a chunk straddling a value array and an exact
one is kept whole here, and the merge's time is the calibrated float32 merge's (`costs["merge_s"]`).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from p2plearn.filter import make_filter
from p2plearn.options import Options
from p2plearn.selection.view import DATAGRAM_DATA
from p2plearn.sync.codec import MessageCodec
from p2plearn.sync.compress import Compressor
from p2plearn.sync.merge import merge_parameter
from p2plearn.sync.robust import RobustMerge
from p2plearn.transport.delivery import Delivery, Reason

# what a receiver's engine hands over of a flow's message: (sender, receiver, message id, arrays, which
# arrays must arrive whole, the fraction of chunks delivered) -> the delivery, or None for nothing
Deliver = Callable[[int, int, int, list[np.ndarray], list[bool], float], "Delivery | None"]

ALIGN = 8  # the engine places each segment on an 8-byte boundary, and chunk boundaries fall on them
LOSSY = 1.0  # a loss bound for every layer: what the codec then bounds at 0 is what must arrive whole


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class Messages:
    """A virtual peer population's compressed or value-filtered messages (see the module's doc).

    sizes: elements of each of the model's tensors, in the replica's row order (the filter's layers);
    rows: the replicas' [n, P] parameters at the start (the filter measures changes from them);
    staleness: rounds a merge may take messages from behind the current one (SSP's s; BSP 0).
    """

    # what a result's `model` field says of these messages
    MODEL = ("messages encoded per peer as in training, bytes on the network the encoded bytes x message_bytes / "
             "replica_bytes; lost chunks drawn among the value-only chunks (scales, headers and indices repaired "
             "first); merge time the calibrated float32 merge's")

    def __init__(self, options: Options, sizes: list[int], n: int, message_bytes: float, replica_bytes: float,
                 rows: np.ndarray, staleness: int):
        self.options = options
        self.layer_ranges = row_layers(sizes)
        self.scale = message_bytes / replica_bytes   # network bytes per byte of the replica's message
        self.dense_bytes = message_bytes
        self.staleness = staleness
        self.filtering = options.filter == "value"
        # per peer, training's codec over its row (one bucket, its tensors the layers) with the peer's own
        # filter or compressor; it checks what it reads against the row's size, and encodes from a copy
        if self.filtering:
            # as p2plearn.train builds the filter from the options
            self.filters = [make_filter("value", granularity=options.filter_granularity,
                                        init_scale=options.filter_init_scale, period=options.filter_period)
                            for _ in range(n)]
            self.previous = rows.copy()  # each peer's model as last merged: the filter reads the change since
            self.codecs = [MessageCodec([row], self.layer_ranges, value_filter=f) for row, f in zip(rows, self.filters)]
        else:
            self.codecs = [MessageCodec([row], self.layer_ranges,
                                        compressor=Compressor(options.compress, [row.size], options.keep_nonfinite))
                           for row in rows]
        self._sent: dict[int, list[tuple[list[np.ndarray], list[bool]]]] = {}  # round -> per peer (arrays, exact)
        self._bytes_total = 0.0
        self._messages = 0

    @classmethod
    def of(cls, options: Options, sizes: list[int], n: int, message_bytes: float, replica_bytes: float,
           rows: np.ndarray, staleness: int) -> "Messages | None":
        """The population's messages, or None when they are plain float32 values (no flag)."""
        if options.compress == "none" and options.filter != "value":
            return None
        return cls(options, sizes, n, message_bytes, replica_bytes, rows, staleness)

    def encode(self, rnd: int, rows: np.ndarray) -> np.ndarray:
        """Every peer's message of round `rnd` from its replica (rows[i]); returns each one's bytes
        on the simulated network. Messages older than the staleness window are dropped."""
        for old in [r for r in self._sent if r < rnd - self.staleness]:
            del self._sent[old]
        sent = [self._encode_one(i, rnd, row) for i, row in enumerate(rows)]
        self._sent[rnd] = sent
        sizes = np.array([sum(a.nbytes for a in arrays) for arrays, _ in sent], dtype=float) * self.scale
        self._bytes_total += float(sizes.sum())
        self._messages += len(sizes)
        return sizes

    def _encode_one(self, i: int, rnd: int, row: np.ndarray) -> tuple[list[np.ndarray], list[bool]]:
        """Peer i's message (its arrays, and which must arrive whole) from its replica's row."""
        mine = row.copy()  # a message may view the values it was encoded from: it keeps this round's
        changes = [mine - self.previous[i]] if self.filtering else None
        message = self.codecs[i].encode(rnd, [0], changes, model=[mine])
        arrays, bounds = self.codecs[i].wire(message, [LOSSY] * len(self.layer_ranges))
        return arrays, [bound == 0.0 for bound in bounds]

    def sent(self, rnd: int, sender: int) -> tuple[list[np.ndarray], list[bool]]:
        """`sender`'s round-`rnd` message: its arrays, and per array whether it must arrive whole."""
        return self._sent[rnd][sender]

    def delivery(self, rnd: int, sender: int, delivered: float, rng: np.random.Generator) -> Delivery:
        """What a receiver of `sender`'s round-`rnd` message gets when `delivered` (a fraction) of its
        chunks arrived, the missing ones drawn with `rng` (`virtual_delivery`)."""
        return virtual_delivery(sender, rnd, *self.sent(rnd, sender), delivered, rng, self.scale)

    def merge(self, row: np.ndarray, deliveries: list[Delivery], robust: RobustMerge | None = None) -> None:
        """Average the deliveries into a receiver's replica (its row, in place), as its synchronizer
        would (through `robust`, the receiver's robust merge, when given): the decoded values that
        arrived; a delivery the real receiver could not read (its filter header lost) is dropped."""
        decoder = self.codecs[0]  # reading a message needs only the format and the model's layout
        usable = [(d.sender, c) for d, (c, _) in zip(deliveries, map(decoder.read, deliveries)) if c is not None]
        for k, target in enumerate(decoder.targets_of([row])):
            got = [(s, c[k]) for s, c in usable if c[k] is not None]
            if robust is None:
                merge_parameter(target, [c for _, c in got])
            else:
                robust.merge_parameter(k, target, [c for _, c in got], [s for s, _ in got])

    def merged(self, rows: np.ndarray) -> None:
        """The round's merges and outer steps are done: the filter's changes count from here."""
        if self.filtering:
            np.copyto(self.previous, rows)

    def summary(self) -> dict:
        """For the result: the mean bytes of a message on the network, its ratio to the dense
        float32 message's, and what the messages were."""
        mean = self._bytes_total / self._messages if self._messages else self.dense_bytes
        o = self.options
        what = f"--compress {o.compress}" if not self.filtering else \
            f"--filter value ({o.filter_granularity}, init scale {o.filter_init_scale}, period {o.filter_period})"
        return {"messages": what, "bytes_per_message": mean, "bytes_ratio": mean / self.dense_bytes}


def row_layers(sizes: list[int]) -> list[tuple[int, int, int]]:
    """The layers of a replica's row (one array) of tensors of `sizes` elements, in order: (0, first
    element, end element) each, as a codec takes them."""
    return [(0, int(lo), int(lo + size)) for lo, size in zip(np.cumsum([0, *sizes[:-1]]), sizes)]


def virtual_delivery(sender: int, msg_id: int, arrays: list[np.ndarray], exact: list[bool], delivered: float,
                     rng: np.random.Generator, scale: float) -> Delivery:
    """A message of `arrays` as a receiver's engine hands it over when `delivered` (a fraction) of its
    chunks arrived: the arrays laid out one after another (8-byte aligned) and cut into as many chunks
    as the message's bytes on the network (its bytes x `scale`) fill datagrams; the missing chunks
    drawn with `rng` among those holding values only (an `exact` array, one the sender's loss bound
    is 0 for, is repaired first, as the engine does), then among the rest."""
    offsets, end = [], 0
    for a in arrays:
        offsets.append(end)
        end = _aligned(end + a.nbytes)
    network_bytes = sum(a.nbytes for a in arrays) * scale
    chunk = max(ALIGN, _aligned(math.ceil(end / max(1, math.ceil(network_bytes / DATAGRAM_DATA)))))
    nchunks = max(1, -(-end // chunk))
    arrived = np.ones(nchunks, dtype=bool)
    missing = nchunks - int(delivered * nchunks) if delivered < 1.0 else 0
    if missing:
        holds_exact = np.zeros(nchunks, dtype=bool)
        for a, off, ex in zip(arrays, offsets, exact):
            if ex and a.nbytes:
                holds_exact[off // chunk:(off + a.nbytes - 1) // chunk + 1] = True
        values_only, others = np.flatnonzero(~holds_exact), np.flatnonzero(holds_exact)
        arrived[rng.permutation(values_only)[:missing]] = False
        if missing > values_only.size:
            arrived[rng.permutation(others)[:missing - values_only.size]] = False
    fractions = [_arrived_fraction(arrived, chunk, off, a.nbytes) for a, off in zip(arrays, offsets)]
    return Delivery(sender=sender, msg_id=msg_id, arrays=arrays, mask=arrived,
                    reason=Reason.COMPLETE if arrived.all() else Reason.CLOSED, source=("virtual", sender),
                    fractions=fractions, chunk_size=chunk, meta_len=0, offsets=offsets)


def _arrived_fraction(arrived: np.ndarray, chunk: int, offset: int, nbytes: int) -> float:
    """The fraction of bytes [offset, offset + nbytes) in chunks that arrived."""
    if nbytes == 0:
        return 1.0
    first, last = offset // chunk, (offset + nbytes - 1) // chunk
    starts = np.maximum(np.arange(first, last + 1) * chunk, offset)
    ends = np.minimum(np.arange(first + 1, last + 2) * chunk, offset + nbytes)
    return float(((ends - starts) * arrived[first:last + 1]).sum() / nbytes)
