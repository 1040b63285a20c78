"""`HostStaging`: the host buffers a round reads and merges, for a model's buckets on any device.

A round works on numpy arrays on the host (the engine sends from them, the C merge writes into
them). Three cases:

* a CPU model, rounds in line (``staging="direct"``, no ``--overlap``): the host arrays are the
  buckets themselves; nothing is copied;
* a CPU model with ``--overlap``: separate host buffers, so local steps go on while a round
  works on the copy;
* a device model (CUDA or any other torch device), or ``staging="host"`` on a CPU model: separate
  host buffers (pinned where CUDA is available), the device-to-host copies on a side stream as a
  round starts, the host-to-device copy of the result on the compute stream. The compute stream
  never waits for the host: the next optimizer step waits (on the device) for the copy that reads
  the parameters it writes, and the result's copy is ordered before the steps that read it.
  On the CPU the stream calls have no equivalent and are skipped: ``staging="host"`` runs every
  other line of the device path, which is how CI tests it.

Memory: one host copy of the exchanged tensors in the last two cases, plus (with ``--overlap``)
the snapshot a round started from (docs/memory.md).
"""
from __future__ import annotations

import numpy as np
import torch

from p2plearn.sync.bfloat16 import BF16Array
from p2plearn.train.buckets import Buckets

STAGINGS = ("direct", "host")


def numpy_view(t: torch.Tensor) -> np.ndarray:
    """A numpy array over a CPU tensor's memory: bfloat16, which numpy lacks, as a `BF16Array`."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).view(BF16Array)
    return t.numpy()


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype a change or mix of `dtype` values is computed in: float64 stays, the rest float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _as_tensor(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The torch tensor over a host array made by `numpy_view` (no copy)."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(np.asarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.asarray(a))


class HostStaging:
    """Host arrays for `buckets` and the copies between them and the model.

    Args:
        buckets: the model's buckets (on any device).
        staging: "direct" (a CPU model's rounds use its own memory where they can) or "host"
            (always separate host buffers and copies, as for a device model). A device model is
            always staged.
        separate: the rounds need a copy even on the CPU (``--overlap``: the model moves on).
        pieces: what the rounds exchange, as (bucket, first element, end element) each (with
            ``--fragments``, buckets cut into balanced fragments); default: the whole buckets.

    `arrays` are the rounds' host arrays, one per piece; `bucket_arrays` the same memory per
    bucket (whole-model messages: a joiner's state, the final average).
    Use: ``to_host()`` as a round starts, ``wait_host()`` before the host arrays are read,
    then either ``to_device()`` (the round's result replaces the model), or, for a model that
    took steps meanwhile, ``add_change(before)`` (the result's change is added) or ``mix(pieces,
    alpha)`` (the model moves alpha of the way to the result); ``before_step()`` before each
    optimizer step.
    """

    def __init__(self, buckets: Buckets, staging: str = "direct", separate: bool = False,
                 pieces: list[tuple[int, int, int]] | None = None):
        if staging not in STAGINGS:
            raise ValueError(f"staging must be one of {', '.join(STAGINGS)}, got {staging!r}")
        self.buckets = buckets
        device = buckets.device
        self.staged = staging == "host" or device.type != "cpu" or separate
        if not self.staged:
            self.host = buckets.flats
        else:
            pin = torch.cuda.is_available()  # pinned memory makes the copies asynchronous; it needs CUDA
            self.host = [torch.empty(f.numel(), dtype=f.dtype, pin_memory=pin) for f in buckets.flats]
        pieces = pieces or [(b, 0, f.numel()) for b, f in enumerate(buckets.flats)]
        self.bucket_arrays = [numpy_view(h) for h in self.host]
        self.arrays = [self.bucket_arrays[b][lo:hi] for b, lo, hi in pieces]
        self._host_pieces = [self.host[b][lo:hi] for b, lo, hi in pieces]
        self._model_pieces = [buckets.flats[b][lo:hi] for b, lo, hi in pieces]
        self._side = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._copied: torch.cuda.Event | None = None  # the device-to-host copy in flight
        self.to_host()
        self.wait_host()

    def to_host(self) -> None:
        """Start copying the model into the host arrays (on the side stream, after the compute
        stream's work so far: the last optimizer step). Returns at once on a device."""
        if not self.staged:
            return
        if self._side is None:
            for h, f in zip(self.host, self.buckets.flats):
                h.copy_(f)
            return
        self._side.wait_stream(torch.cuda.current_stream(self._side.device))
        with torch.cuda.stream(self._side):
            for h, f in zip(self.host, self.buckets.flats):
                h.copy_(f, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record(self._side)

    def wait_host(self) -> None:
        """Block this thread (not the device) until the copy `to_host` started has landed."""
        if self._copied is not None:
            self._copied.synchronize()

    def before_step(self) -> None:
        """The next optimizer step writes the parameters a copy in flight reads: make the compute
        stream wait for it (on the device; the host goes on)."""
        if self._copied is not None:
            torch.cuda.current_stream(self._side.device).wait_event(self._copied)
            self._copied = None

    def to_device(self) -> None:
        """The host arrays (a round's result) become the model."""
        if not self.staged:
            return
        for h, f in zip(self.host, self.buckets.flats):
            f.copy_(h, non_blocking=True)  # on the compute stream: ordered before the steps that read it

    def add_change(self, before: dict[int, np.ndarray]) -> None:
        """Add what the round changed (host piece i minus ``before[i]``, what it started from, for
        the pieces it carried) to the model, which took local steps since: those are kept.
        Half-precision values add in float32 and round once."""
        for i, b in before.items():
            h, f = self._host_pieces[i], self._model_pieces[i]
            wide = _wide(f.dtype)
            change = (h.to(wide) - _as_tensor(b, f.dtype).to(wide)).to(f.device, non_blocking=True)
            if f.dtype == wide:
                f.add_(change)
            else:
                f.copy_(f.to(wide) + change)

    def mix(self, pieces: list[int], alpha: float) -> None:
        """The model's pieces `pieces` become (1 - alpha) x themselves + alpha x the host pieces (a
        round's result): alpha = 1 copies the result exactly. Half precision mixes in float32."""
        for i in pieces:
            h, f = self._host_pieces[i], self._model_pieces[i]
            wide = _wide(f.dtype)
            result = h.to(f.device, non_blocking=True).to(wide)
            if f.dtype == wide:
                f.lerp_(result, alpha)  # exact at alpha = 1: torch computes end - (end - start) * 0
            else:
                f.copy_(f.to(wide).lerp_(result, alpha))

    def snapshot(self, pieces: list[int]) -> dict[int, np.ndarray]:
        """Copies of the host pieces `pieces` (what a round starts from), by index."""
        return {i: self.arrays[i].copy() for i in pieces}

    def model_copy(self) -> list[np.ndarray]:
        """A copy of the model's values as host arrays per bucket, taken now (for a joiner, the final
        average)."""
        return [numpy_view(f.detach().to("cpu", copy=True)) for f in self.buckets.flats]
