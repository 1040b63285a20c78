"""`CollectiveStaging`: host copies of one collective's device tensors, as gloo stages CUDA tensors.

The engine sends from and merges into host memory. A collective on CUDA tensors (DDP's gradient
buckets and its start-up broadcast of a CUDA model, say) therefore runs on host copies:

* at the call, on the caller's thread: a side stream waits for the caller's current stream (the
  kernels that produce the tensors) and copies each input into a pinned host buffer; nothing waits
  on the host;
* on the group's thread, before the collective: it waits for those copies;
* after it: the outputs are copied back on the side stream and waited for, then the work completes,
  so whoever waits on the work reads the result.

A tensor on another device (not CUDA) is copied at the call and back after the collective, without
streams. CPU tensors are used in place, unless ``staging="host"`` (``--staging host``,
``P2PLEARN_STAGING=host``) copies them too: that runs every line of the device path but the stream
calls on the CPU, which is how CI tests it.
"""
from __future__ import annotations

import torch


class CollectiveStaging:
    """The host side of one collective's tensors.

    Args:
        force: stage CPU tensors too (``staging="host"``).
        side: the CUDA stream the copies run on (one per group, made by the group at its first
            CUDA tensor); None where no CUDA tensor is staged.

    ``read(t)``, ``write(t)`` and ``update(t)`` return the host tensor the collective uses for
    ``t``: read copies ``t`` in, write copies the host tensor back into ``t`` after the
    collective, update does both. Call ``wait_inputs()`` before the collective and ``write_back()``
    after it, both on the group's thread.
    """

    def __init__(self, force: bool = False, side: torch.cuda.Stream | None = None) -> None:
        self.force = force
        self.side = side
        self._back: list[tuple[torch.Tensor, torch.Tensor]] = []  # (caller's tensor, its host copy)
        self._copied: torch.cuda.Event | None = None  # the inputs' copies, recorded on `side`

    def read(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._stage(tensor, copy_in=True, copy_back=False)

    def write(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._stage(tensor, copy_in=False, copy_back=True)

    def update(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._stage(tensor, copy_in=True, copy_back=True)

    def _stage(self, tensor: torch.Tensor, copy_in: bool, copy_back: bool) -> torch.Tensor:
        if tensor.device.type == "cpu" and not self.force:
            return tensor
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)
        if tensor.is_cuda:
            self.side.wait_stream(torch.cuda.current_stream(tensor.device))
            with torch.cuda.stream(self.side):
                if copy_in:
                    host.copy_(tensor, non_blocking=True)
                tensor.record_stream(self.side)  # the caller may free it before the copy back
            self._copied = torch.cuda.Event()
            self._copied.record(self.side)
        elif copy_in:
            host.copy_(tensor)
        if copy_back:
            self._back.append((tensor, host))
        return host

    def wait_inputs(self) -> None:
        if self._copied is not None:
            self._copied.synchronize()

    def write_back(self) -> None:
        cuda = [(t, h) for t, h in self._back if t.is_cuda]
        if cuda:
            with torch.cuda.stream(self.side):
                for tensor, host in cuda:
                    tensor.copy_(host, non_blocking=True)
            self.side.synchronize()
        for tensor, host in self._back:
            if not tensor.is_cuda:
                tensor.copy_(host)
