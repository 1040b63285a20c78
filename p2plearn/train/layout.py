"""`ModelLayout`: which of a model's tensors peers exchange, how they are packed into buckets, and
how the rounds see them (layers, on the buckets or on their fragments).

The tensors are packed once, as the optimizer is made (`p2plearn.train.buckets`); with
``--fragments F`` the buckets are cut where each F-th of the model's bytes ends
(`p2plearn.sync.fragments`), and a tensor cut between two pieces becomes one layer per part, so a
per-layer loss bound covers exactly the bytes of its piece.

Tuning: ``bucket_bytes`` (``--bucket-mb``) and ``fragments`` (``--fragments``); see `Buckets` and
`p2plearn.sync.fragments`.
"""
from __future__ import annotations

import dataclasses

import torch

from p2plearn.sync.fragments import Fragments, fragment_pieces
from p2plearn.tolerance import Layer
from p2plearn.train.buckets import Buckets

NORM_TYPES = (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm)


def exchanged_tensors(model: torch.nn.Module, buffers: bool = True) -> dict[str, torch.Tensor]:
    """What peers average, by state-dict name: every trainable parameter, then (``buffers``) every
    floating buffer, such as BatchNorm's running mean and variance. Integer buffers (BatchNorm's
    ``num_batches_tracked``) stay local: each counts this peer's own batches. A frozen parameter
    (``requires_grad`` False) changes on no peer and is not exchanged, as DDP leaves it out of its
    buckets: compressed rounds would blur it a little each round, with nothing to pull it back."""
    tensors = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if buffers:
        tensors.update((name, b) for name, b in model.named_buffers() if b.is_floating_point())
    return tensors


def describe_layers(model: torch.nn.Module, buffers: bool = False) -> list[Layer]:
    """One Layer per exchanged tensor (see `exchanged_tensors`), in its order; norm parameters and
    buffers marked "norm", biases "bias"."""
    kinds = {}
    for module in model.modules():
        for name, t in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            kinds[id(t)] = "norm" if isinstance(module, NORM_TYPES) else ("bias" if name == "bias" else "weight")
    return [Layer(name=name, numel=t.numel(), nbytes=t.numel() * t.element_size(), depth=i,
                  kind=kinds.get(id(t), "weight"))
            for i, (name, t) in enumerate(exchanged_tensors(model, buffers).items())]


def layers_on_pieces(layers: list[Layer], ranges: list[tuple[int, int, int]],
                     pieces: list[tuple[int, int, int]]) -> tuple[list[Layer], list[tuple[int, int, int]]]:
    """`layers` (one per tensor, at (bucket, start, end) `ranges`) as the rounds see them on
    `pieces` ((bucket, start, end) each): a tensor cut between pieces becomes one layer per part
    (named with its element range), each with its range in its piece."""
    out, out_ranges = [], []
    for layer, (bucket, start, end) in zip(layers, ranges):
        parts = [(p, max(start, lo), min(end, hi)) for p, (b, lo, hi) in enumerate(pieces)
                 if b == bucket and max(start, lo) < min(end, hi)] or [(_piece_at(pieces, bucket, start), start, end)]
        for p, lo, hi in parts:
            name = layer.name if len(parts) == 1 else f"{layer.name}[{lo - start}:{hi - start}]"
            itemsize = layer.nbytes // max(1, layer.numel)
            out.append(dataclasses.replace(layer, name=name, numel=hi - lo, nbytes=(hi - lo) * itemsize))
            out_ranges.append((p, lo - pieces[p][1], hi - pieces[p][1]))
    return out, out_ranges


def _piece_at(pieces: list[tuple[int, int, int]], bucket: int, element: int) -> int:
    """The piece holding `element` of `bucket` (an empty tensor's place: the piece it starts in or ends)."""
    return next(p for p, (b, lo, hi) in enumerate(pieces) if b == bucket and lo <= element <= hi)


class ModelLayout:
    """The exchanged tensors of `model`, packed into buckets (each tensor becomes a view of its
    bucket), and the pieces and layers the rounds exchange.

    Attributes: ``buckets`` (`Buckets`), ``tensors`` (name -> the tensor's data, a view of its
    bucket), ``params`` (the same, in order), ``pieces`` ((bucket, start, end) per array a round
    carries), ``layers`` and ``layer_ranges`` (one `Layer` per tensor or part of one, and where
    it sits: (piece, start, end)). A model of fewer elements than `fragments` is refused here,
    before any engine starts.
    """

    def __init__(self, model: torch.nn.Module, buffers: bool, bucket_bytes: int, fragments: int):
        exchanged = exchanged_tensors(model, buffers)
        self.buckets = Buckets(exchanged, bucket_bytes)
        self.tensors = {name: t.data for name, t in exchanged.items()}  # views of the buckets now
        self._model = model  # the caller's; read by `moved` only
        self.params = list(self.tensors.values())
        # With fragments, the buckets cut where each F-th of the model's bytes ends: equal fragments
        flats = self.buckets.flats
        self.pieces = fragment_pieces(self.buckets.nbytes(), [f.element_size() for f in flats], fragments)
        Fragments([(hi - lo) * flats[b].element_size() for b, lo, hi in self.pieces], fragments)
        self.layers, self.layer_ranges = layers_on_pieces(describe_layers(model, buffers), self.buckets.ranges(),
                                                          self.pieces)

    def moved(self) -> str | None:
        """The name of the first exchanged tensor that the model no longer holds in its bucket, or
        None. Moving the model after it was packed (``model.to(...)``, ``.double()``), assigning
        ``parameter.data`` or ``load_state_dict(..., assign=True)`` gives it tensors of its own: the
        rounds would go on averaging the buckets while it trains on tensors no peer sees."""
        held = dict(self._model.named_parameters())
        held.update(self._model.named_buffers())
        for name, view in self.tensors.items():
            tensor = held.get(name)
            if tensor is None or tensor.data_ptr() != view.data_ptr():
                return name
        return None

    def unpack(self, flats: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-bucket tensors as the model's tensors, by state-dict name, in each tensor's dtype and shape."""
        return {name: flats[s.bucket][s.start:s.end].to(p.dtype).reshape(p.shape)
                for name, s, p in zip(self.tensors, self.buckets.slots, self.params)}
