"""What a virtual receiver's engine hands over of a flow's message: which chunks arrived.

    arrivals = Arrivals(seed, message_bytes, replica_bytes, replicas.sizes)
    c = arrivals.plain(sender, receiver, rnd, values, delivered, layer_delivered)  # a plain float32 message
    d = arrivals.delivery(sender, receiver, rnd, arrays, exact, delivered)         # an encoded one
    arrivals.deliver = replay      # what real engines delivered, in place of the draw (the equivalence tests)

By default the chunks that arrived are drawn with the run's mask generator (seeded: a run is a
function of its seed), the flow's delivered fraction of them:
- a plain float32 message (`VirtualTraining`'s own path, the one a 1,000-peer run takes) is cut into
  as many chunks as its bytes on the network fill datagrams, the missing ones at random, per layer
  when the tolerance policy gives each layer its own fraction; what the receiver merges is the
  sender's values with that chunk mask (a `Contribution`), built without a `Delivery`;
- an encoded message (compressed, value-filtered, a partitioned round's part) is a `Delivery` laid
  out as the engine lays out segments (`sim.messages.virtual_delivery`).
Given `deliver` (a `sim.messages.Deliver`: the delivery, or None for nothing), both kinds take what it
hands over instead; a plain one is then read with training's codec (`sync.codec.MessageCodec`), as a
real receiver reads it, and a message the codec refuses is not merged.
"""
from __future__ import annotations

import math

import numpy as np

from p2plearn.selection.view import DATAGRAM_DATA
from p2plearn.sim.messages import Deliver, row_layers, virtual_delivery
from p2plearn.sync.codec import MessageCodec
from p2plearn.sync.merge import Contribution
from p2plearn.transport.delivery import ChunkMask, Delivery


class Arrivals:
    """The chunk masks of a virtual run's messages (see the module's doc).

    seed: the mask generator's; message_bytes: a message's bytes on the simulated network (they set
    its chunk count); replica_bytes: the replica's float32 bytes; sizes: elements of each of the
    model's tensors, in the replica's row order (its layers).
    """

    def __init__(self, seed: int, message_bytes: float, replica_bytes: float, sizes: list[int]):
        self.rng = np.random.default_rng(seed)
        self.scale = message_bytes / replica_bytes  # network bytes per byte of the replica's message
        self.nchunks = max(1, math.ceil(message_bytes / DATAGRAM_DATA))
        self.chunk_size = max(1, math.ceil(replica_bytes / self.nchunks))
        self.layer_ranges = row_layers(sizes)
        # per chunk of a plain message, the layer its first byte belongs to (per-layer chunk masks)
        first_bytes = [lo * 4 for _, lo, _ in self.layer_ranges]
        self.chunk_layer = np.searchsorted(first_bytes, np.arange(self.nchunks) * self.chunk_size, "right") - 1
        self._codec: MessageCodec | None = None  # reads replayed plain messages; built on the first
        self.deliver: Deliver | None = None  # set by a test: what real engines delivered; None: the draw

    def plain(self, sender: int, receiver: int, msg_id: int, values: np.ndarray, delivered: float,
              layer_delivered: np.ndarray) -> Contribution | None:
        """What `receiver` merges of `sender`'s plain message (`values`, float32) when `delivered` of
        it arrived, layer_delivered[l] of layer l (one entry: the whole message); None: nothing."""
        if self.deliver is None:
            return Contribution(values, chunks=self._mask(layer_delivered))
        d = self.deliver(sender, receiver, msg_id, [values], [False], delivered)
        if d is None:
            return None
        if self._codec is None:
            self._codec = MessageCodec([np.empty_like(values)], self.layer_ranges)
        contributions, problem = self._codec.read(d)
        return None if problem else contributions[0]

    def delivery(self, sender: int, receiver: int, msg_id: int, arrays: list[np.ndarray], exact: list[bool],
                 delivered: float) -> Delivery | None:
        """What `receiver`'s engine hands over of `sender`'s encoded message (`arrays`; `exact`: which
        must arrive whole) when `delivered` of its chunks arrived; None: nothing."""
        if self.deliver is not None:
            return self.deliver(sender, receiver, msg_id, arrays, exact, delivered)
        return virtual_delivery(sender, msg_id, arrays, exact, delivered, self.rng, self.scale)

    def _mask(self, layer_delivered: np.ndarray) -> ChunkMask | None:
        """The chunks of a plain message that arrived: of each layer's (one: the whole message), the
        fraction `layer_delivered`, the missing ones at random."""
        if (layer_delivered >= 1.0).all():
            return None
        if len(layer_delivered) == 1:
            arrived = np.zeros(self.nchunks, dtype=bool)
            arrived[self.rng.permutation(self.nchunks)[:int(layer_delivered[0] * self.nchunks)]] = True
            return ChunkMask(arrived, 0, self.chunk_size)
        arrived = np.ones(self.nchunks, dtype=bool)
        for layer, fraction in enumerate(layer_delivered.tolist()):
            if fraction < 1.0:
                chunks = np.flatnonzero(self.chunk_layer == layer)
                arrived[self.rng.permutation(chunks)[int(fraction * len(chunks)):]] = False
        return ChunkMask(arrived, 0, self.chunk_size)
