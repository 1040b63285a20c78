"""`Buckets`: the exchanged tensors packed into a few contiguous flat tensors, so that a round
costs the same Python work for 300 tensors as for 3.

Each tensor becomes a view of its bucket (``t.data = bucket[start:end].view_as(t)``, as apex's
and FSDP's flat parameters do): the model, its optimizer and its state dicts see the same
tensors as before, while the round reads and merges whole buckets. Tensors are grouped by
dtype and device, in model order, and a bucket is closed once it holds `cap_bytes` (a tensor
larger than the cap gets a bucket of its own; no tensor is split).

Tuning: ``cap_bytes`` (the option ``--bucket-mb``) trades Python work per round (a few calls per
bucket) against the size of one segment (a larger segment waits longer for its last chunk
before its merge can start); a cap above the model's size leaves one bucket per dtype.
``--fragments F`` cuts the buckets further where each F-th of the bytes ends (`p2plearn.sync.fragments`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_CAP_BYTES = 25 * 2**20  # DDP's default bucket size


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives: elements [start, end) of bucket `bucket`."""

    bucket: int
    start: int
    end: int


class Buckets:
    """Packs `tensors` (name -> tensor, in exchange order) into flat buckets and makes each tensor
    a view of its bucket. `flats[b]` is bucket b (1-D, on the tensors' device), `slots[i]` where
    tensor i sits. Tensors must be contiguous, floating point, and on one device."""

    def __init__(self, tensors: dict[str, torch.Tensor], cap_bytes: int = DEFAULT_CAP_BYTES):
        if cap_bytes <= 0:
            raise ValueError(f"cap_bytes must be > 0, got {cap_bytes}")
        self.names = list(tensors)
        self.slots: list[Slot] = []
        sizes: list[int] = []        # elements per bucket
        kinds: list[tuple] = []      # (dtype, device) per bucket
        open_bucket: dict[tuple, int] = {}  # the bucket still filling, per (dtype, device)
        for name, t in tensors.items():
            if not t.is_floating_point():
                raise ValueError(f"{name} is {t.dtype}: p2plearn exchanges floating-point tensors")
            if t.is_meta:
                raise ValueError(f"{name} is on meta: it holds no values to exchange")
            if not t.is_contiguous():
                raise ValueError(f"{name} is not contiguous")
            kind = (t.dtype, t.device)
            b = open_bucket.get(kind)
            if b is None or (sizes[b] + t.numel()) * t.element_size() > cap_bytes and sizes[b] > 0:
                b = open_bucket[kind] = len(sizes)
                sizes.append(0)
                kinds.append(kind)
            self.slots.append(Slot(b, sizes[b], sizes[b] + t.numel()))
            sizes[b] += t.numel()
        devices = {device for _, device in kinds}
        if len(devices) > 1:  # a model split across devices (model parallel) would need a round per device
            raise ValueError(f"the exchanged tensors are on {len(devices)} devices ({', '.join(map(str, devices))}): "
                             f"p2plearn averages a model that lives on one")
        self.flats = [torch.empty(n, dtype=dtype, device=device) for n, (dtype, device) in zip(sizes, kinds)]
        for t, slot in zip(tensors.values(), self.slots):
            flat = self.flats[slot.bucket][slot.start:slot.end]
            flat.copy_(t.detach().reshape(-1))
            t.data = flat.view_as(t)  # the same tensor object (optimizer, module) on the bucket's memory

    @property
    def device(self) -> torch.device:
        """The device the tensors live on (CPU for a model without any)."""
        return self.flats[0].device if self.flats else torch.device("cpu")

    def nbytes(self) -> list[int]:
        """The bytes of each bucket, in order (what `p2plearn.sync.fragments` balances)."""
        return [f.numel() * f.element_size() for f in self.flats]

    def ranges(self) -> list[tuple[int, int, int]]:
        """(bucket, start, end) per tensor, for the synchronizer."""
        return [(s.bucket, s.start, s.end) for s in self.slots]
