"""A round's message: what of a model travels, with which loss bounds, and how a receiver reads it.

    codec = MessageCodec(arrays, layer_ranges, fragments, compressor=..., value_filter=...)
    message = codec.encode(rnd, carried, changes)          # round rnd's message; its bytes plan the round
    arrays, bounds = codec.wire(message, layer_bounds)     # what `Channel.send` gets, once bounds are known
    contributions, problem = codec.read(delivery)          # per merge target; or why it is dropped

BSP and SSP rounds (`p2plearn.sync.base`) and the simulator's virtual peers (`p2plearn.sim.messages`)
encode and read their messages here; partitioned rounds have their own (`p2plearn.sync.exchange`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from p2plearn.filter import UpdateFilter
from p2plearn.filter.wire import DENSE, SPARSE, EncodedUpdate, layout
from p2plearn.sync.bfloat16 import values
from p2plearn.sync.compress import Compressor
from p2plearn.sync.fragments import Fragments
from p2plearn.sync.inbox import UNUSABLE
from p2plearn.sync.merge import Contribution, unfit
from p2plearn.transport import Delivery

Contributions = list[Contribution | None]  # per merge target, what a message brings (None: nothing)


@dataclass
class Message:
    """One round's message before its loss bounds are known (they come after the plan, which needs
    its bytes). Holds views of the model where the format sends values in place: it must be sent
    before the model changes (a round sends before it merges)."""

    arrays: list[np.ndarray]          # what travels with every bound alike (a plain message is cut by them)
    carried: list[int]                # the model's arrays it carries (its round's fragment)
    model: list[np.ndarray]           # the arrays it was encoded from
    update: EncodedUpdate | None = None  # the value filter's message (filtered format only)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


def filtered_arrays(msg: EncodedUpdate, layers: list[np.ndarray]) -> list[np.ndarray]:
    """The arrays of a value-filtered message: `msg`'s (the filter's choice of elements), with each
    layer it carries holding the layer's current values (dense: all; sparse: at its indices), as
    receivers average values, not updates. `layers`: the model's layers, flat views."""
    arrays = list(msg.arrays)
    for layer, (code, idx, at) in enumerate(layout(arrays, [p.shape for p in layers])):
        flat = values(layers[layer])
        if code == DENSE:
            arrays[at] = flat.astype(np.float32, copy=False)
        elif code == SPARSE:
            arrays[at] = flat[arrays[idx]].astype(np.float32)
    return arrays


def filtered_contributions(d: Delivery, masks: list[np.ndarray | None],
                           layers: list[np.ndarray]) -> Contributions:
    """Per layer of `layers`, what the value-filtered message d brings (None: nothing for it): the
    elements it carries that arrived (masks: per array of d, its element mask; None: all arrived)."""
    parts = layout(d.arrays, [p.shape for p in layers], [m is None for m in masks])
    out: Contributions = []
    for p, (code, idx, at) in zip(layers, parts):
        if code == DENSE:
            mask = masks[at]
            out.append(Contribution(d.arrays[at].reshape(p.shape), None if mask is None else mask.reshape(p.shape)))
        elif code == SPARSE:
            dense, sent = np.zeros(p.size, dtype=np.float32), np.zeros(p.size, dtype=bool)
            where = d.arrays[idx]
            dense[where] = d.arrays[at]
            sent[where] = True if masks[at] is None else masks[at]
            out.append(Contribution(dense.reshape(p.shape), sent.reshape(p.shape)))
        else:
            out.append(None)
    return out


class MessageCodec:
    """Encodes a peer's model into its round's message and reads received messages back as
    contributions to merge, in one of three formats (the run's flags pick it; every peer alike):

    - plain (no flag): the arrays the round carries, values as they are (float32, float16, bfloat16
      bits), cut into segments where the per-layer loss bounds change, so each bound covers its own
      layers' bytes; a segment that is a whole array is read in place, without a copy.
    - compressed (``--compress``: a `Compressor`): its values, then the int8/int4 scales, with its
      error feedback; each array keeps the smallest bound of its layers, the scales bound 0.
    - filtered (``--filter value``: an `UpdateFilter`): the filter's header, sparse indices and the
      current values of what it let through, per layer; header and indices bound 0.

    Tuning is the formats' own: the compressed formats' bytes and error in `p2plearn.sync.compress`,
    the filter's threshold in `p2plearn.filter.value`. Compression and the filter do not combine.

    Args:
        arrays: the model, flat (1-D) arrays: what `encode` sends by default, and what read
            contributions are checked against (size, dtype).
        layer_ranges: (array, first element, end element) of each layer, in order inside each array.
        fragments: which arrays each round's message carries (a delivery is read as its own round's
            fragment); None: every message carries every array.
        compressor, value_filter: the format (neither: plain). The codec encodes with them, so their
            state (residuals) advances with each `encode`; their owner saves it.
    Not thread-safe: one round at a time.
    """

    def __init__(self, arrays: list[np.ndarray], layer_ranges: list[tuple[int, int, int]],
                 fragments: Fragments | None = None, *, compressor: Compressor | None = None,
                 value_filter: UpdateFilter | None = None):
        if compressor is not None and value_filter is not None:
            raise ValueError("compression does not apply with a value filter yet (the filter picks what travels)")
        self.arrays = arrays
        self.layer_ranges = layer_ranges
        self.fragments = fragments or Fragments([a.nbytes for a in arrays])
        self.compressor = compressor
        self.filter = value_filter
        # Per array, its layers in element order: the bound runs are cut per array.
        self._array_layers = [sorted((i for i, r in enumerate(layer_ranges) if r[0] == a),
                                     key=lambda i: layer_ranges[i][1]) for a in range(len(arrays))]
        self.targets = self.targets_of(arrays)

    def targets_of(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """What contributions merge into, for a model of these (flat) arrays laid out as this
        codec's: its layers with the value filter (it sends per layer), else the arrays."""
        if self.filter is None:
            return arrays
        return [arrays[a][lo:hi] for a, lo, hi in self.layer_ranges]

    def encode(self, rnd: int, carried: list[int], changes: list[np.ndarray] | None = None,
               model: list[np.ndarray] | None = None) -> Message:
        """Round `rnd`'s message of the arrays `carried`. changes: per array, the model's change
        since the last round (the value filter reads it; others ignore it). model: the arrays to
        send (default this codec's). Compression residuals and the filter's state advance here,
        for what is sent only."""
        model = self.arrays if model is None else model
        if self.compressor is not None:
            encoded = self.compressor.encode([model[t] for t in carried], [(t, 0, model[t].size) for t in carried])
            self.compressor.settle()  # a message a round
            return Message(encoded, carried, model)
        if self.filter is None:
            return Message([model[t] for t in carried], carried, model)
        update = self.filter.encode(rnd, [changes[a][lo:hi] for a, lo, hi in self.layer_ranges])
        return Message(filtered_arrays(update, self.targets_of(model)), carried, model, update)

    def wire(self, message: Message, bounds: list[float]) -> tuple[list[np.ndarray], list[float]]:
        """The arrays to send and their loss bounds, from the policy's per-layer `bounds`."""
        if self.compressor is not None:
            per_array = self.array_bounds(bounds)
            return message.arrays, self.compressor.loss_bounds([per_array[t] for t in message.carried])
        if message.update is not None:
            return message.arrays, message.update.wire_bounds(bounds)
        runs = self._runs(bounds, message.carried)
        return [message.model[a][lo:hi] for a, lo, hi, _ in runs], [b for *_, b in runs]

    def array_bounds(self, bounds: list[float]) -> list[float]:
        """Per array, the smallest bound of its layers: where a message cannot split an array by
        its layers' bounds (compressed or partitioned rounds), none of them loses more than its own."""
        return [min((bounds[i] for i in layers), default=0.0) for layers in self._array_layers]

    def _runs(self, bounds: list[float], carried: Sequence[int]) -> list[tuple[int, int, int, float]]:
        """(array, start, end, bound): each of the arrays `carried` cut where its layers' bounds
        change; one run per array when they are all alike (every policy but the per-layer one)."""
        runs = []
        for a in carried:
            layers = self._array_layers[a]
            start, bound = 0, bounds[layers[0]] if layers else 0.0
            for i in layers:
                if bounds[i] != bound:
                    lo = self.layer_ranges[i][1]
                    runs.append((a, start, lo, bound))
                    start, bound = lo, bounds[i]
            runs.append((a, start, self.arrays[a].size, bound))
        return runs

    def read(self, d: Delivery) -> tuple[Contributions | None, str | None]:
        """Per merge target, what delivery d brings, validated against the model; or None and why
        d is unusable (its layout was lost, or it does not fit this model: a peer's bug or a
        hostile key holder): the reason its receiver counts the drop under."""
        if d.arrays is None:
            return None, "layout lost"
        try:
            out = self.decode(d)
            problem = "not this model's message" if out is None else next(
                filter(None, (unfit(p, c) for p, c in zip(self.targets, out) if c is not None)), None)
        except UNUSABLE as exc:
            problem = f"undecodable ({type(exc).__name__})"
        return (None, f"unmergeable: {problem}") if problem else (out, None)

    def decode(self, d: Delivery) -> Contributions | None:
        """Per merge target, what d brings, unvalidated; None if d is not a message of this model's
        layout (a malformed filtered message raises one of `UNUSABLE`)."""
        carried = self.fragments.arrays(d.msg_id)  # the fragment of the delivery's own round
        if self.compressor is not None:
            sent = self.compressor.contributions(d, [self.arrays[t].size for t in carried])
            return None if sent is None else self._spread(sent, carried)
        if self.filter is None:
            return self._plain_contributions(d, carried)
        masks = [None if f >= 1.0 else d.element_mask(i) for i, f in enumerate(d.fractions)]
        return filtered_contributions(d, masks, self.targets)

    def _spread(self, contributions: list[Contribution], carried: list[int]) -> Contributions:
        """Per array of the model, what a message carrying the arrays `carried` brings for it."""
        if len(carried) == len(self.arrays):
            return contributions
        out: Contributions = [None] * len(self.arrays)
        for t, c in zip(carried, contributions):
            out[t] = c
        return out

    def _plain_contributions(self, d: Delivery, carried: list[int]) -> Contributions | None:
        """Per array, the contribution of a plain message that carries the arrays `carried` (cut
        into segments as the sender's bounds fell: consecutive segments that fill each array
        exactly, in order; None for the arrays it does not carry); None if the message is not of
        this model."""
        targets = [self.arrays[t] for t in carried]
        out, pieces, filled = [], [], 0
        for i, a in enumerate(d.arrays):
            if len(out) == len(targets):
                return None  # more segments than the fragment holds
            own = targets[len(out)]
            if a.dtype != own.dtype or filled + a.size > own.size:
                return None
            pieces.append(i)
            filled += a.size
            if filled == own.size:
                out.append(self._joined_contribution(d, pieces))
                pieces, filled = [], 0
        return self._spread(out, carried) if len(out) == len(targets) and not pieces else None

    @staticmethod
    def _joined_contribution(d: Delivery, pieces: list[int]) -> Contribution:
        """One array's contribution from its segments: the segment itself when it travelled whole
        (the common case: no copy), else the segments joined, with their element masks."""
        if len(pieces) == 1:
            return Contribution(d.arrays[pieces[0]].reshape(-1), chunks=d.chunks(pieces[0]))
        joined = np.concatenate([d.arrays[i].reshape(-1) for i in pieces])
        if all(d.fractions[i] >= 1.0 for i in pieces):
            return Contribution(joined)
        return Contribution(joined, mask=np.concatenate([d.element_mask(i).reshape(-1) for i in pieces]))
