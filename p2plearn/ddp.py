"""A DDP comm hook that averages gradient buckets within loss bounds, over the p2plearn backend.

    dist.init_process_group("p2plearn")
    model = DistributedDataParallel(model)
    state = p2plearn.ddp.LossTolerantState("adaptive", model=model.module, hadamard=True)
    model.register_comm_hook(state, p2plearn.ddp.loss_tolerant_hook)
    ...
    state.report(loss=loss.item())          # feeds the phase-aware policy (or accuracy=...)

Each bucket is averaged by the group's reduce-scatter + all-gather with the tolerance policy's
bound per layer (the bucket's parameters are its layers, in the order the model lists them:
per-layer bounds map to byte ranges of the bucket) and its deadline per phase (see
`p2plearn.tolerance`: fixed, adaptive Early Close, layerwise, phase). A lost chunk is not a zero:
each element is averaged over the ranks whose chunk arrived, and an averaged chunk that did not
come back keeps this rank's own gradient; so, over independent minibatches, every element is still
an unbiased estimate of the mean gradient.

``hadamard=True`` multiplies each layer's gradient by a randomized Hadamard matrix (random signs,
seeded alike on every rank for each bucket and round, then a Walsh-Hadamard transform in blocks
of up to HADAMARD_BLOCK elements) before it is cut into chunks, and inverts it afterwards: a lost
chunk becomes small noise spread over its block instead of a hole in a few coordinates. It pays
where datagrams are small next to the block (real links: 1472-byte datagrams are 368 floats); on
loopback (64 KiB datagrams) a chunk covers a whole block and it changes nothing.
"""
# (no `from __future__ import annotations`: DDP checks the hook's annotations as objects)
import copy
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from p2plearn.compute import check, ffi, lib
from p2plearn.distributed.backend import ProcessGroupP2P
from p2plearn.tolerance import Layer, NetworkState, TolerancePolicy, TrainingState, make_tolerance

HADAMARD_BLOCK = 1 << 14


class LossTolerantState:
    """The hook's state: the tolerance policy and what it decides from, per bucket.

    Args:
        policy: a TolerancePolicy, or its name (fixed, adaptive, layerwise, phase) built with
            ``policy_args``. Each bucket gets its own copy (the policies keep per-round state).
        model: the module DDP wraps; its parameters' order gives each layer's depth (input side
            first) for the layerwise policy. Without it, a bucket's order is used.
        hadamard: the randomized Hadamard transform per bucket (see the module's docstring).
        process_group: a ProcessGroupP2P; None = the default group. Give DDP's own when it runs
            on a subgroup (``DDP(..., process_group=g)``): the hook cannot see it.
        seed: mixed into the Hadamard signs (the same on every rank).
    """

    def __init__(self, policy: TolerancePolicy | str = "fixed", *, model: torch.nn.Module | None = None,
                 hadamard: bool = False, process_group: Any = None, seed: int = 0, **policy_args: Any) -> None:
        self.policy = make_tolerance(policy, **policy_args) if isinstance(policy, str) else policy
        self.hadamard = hadamard
        self.process_group = process_group
        self.seed = seed
        self._depth = {id(p): i for i, p in enumerate(model.parameters())} if model is not None else {}
        self.buckets: dict[tuple[int, ...], "_BucketState"] = {}  # by index and parameters

    def group(self) -> ProcessGroupP2P:
        pg = self.process_group if self.process_group is not None else dist.distributed_c10d._get_default_group()
        if not isinstance(pg, ProcessGroupP2P):
            raise TypeError(f"loss_tolerant_hook needs the p2plearn backend's group, got {type(pg).__name__}: "
                            f"init_process_group('p2plearn')")
        return pg

    def report(self, loss: float | None = None, accuracy: float | None = None) -> None:
        """What training measured (a step's loss, an evaluation's accuracy): the phase policy reads it."""
        for b in self.buckets.values():
            if loss is not None:
                b.training.record_loss(loss)
            if accuracy is not None:
                b.training.accuracies.append(float(accuracy))

    def records(self) -> list:
        """Every bucket's newest RoundRecords (what the engine measured), oldest first."""
        return sorted((r for b in self.buckets.values() for r in b.network.history), key=lambda r: r.round)

    def _bucket(self, bucket: dist.GradBucket) -> "_BucketState":
        # DDP rebuilds its buckets after the first iteration (in the order gradients came): an index
        # then holds other parameters, and a state of their own
        index, params = bucket.index(), bucket.parameters()
        key = (index, *map(id, params))
        if key not in self.buckets:
            layers = [Layer(name=f"bucket{index}.{i}", numel=p.numel(), nbytes=p.numel() * p.element_size(),
                            depth=self._depth.get(id(p), i), kind="weight" if p.dim() > 1 else "bias")
                      for i, p in enumerate(params)]
            self.buckets[key] = _BucketState(copy.deepcopy(self.policy), layers)
        return self.buckets[key]


class _BucketState:
    def __init__(self, policy: TolerancePolicy, layers: list[Layer]) -> None:
        self.policy = policy
        self.layers = layers
        self.network = NetworkState()
        self.training = TrainingState()
        self.round = 0


def loss_tolerant_hook(state: LossTolerantState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's gradients averaged within the state's loss bounds (see the module)."""
    group = state.group()
    b = state._bucket(bucket)
    if b.policy.reads_update_norms:
        b.training.record_update([float(g.norm()) for g in bucket.gradients()])
    buffer = bucket.buffer()
    b.network.expected_bytes = buffer.numel() * buffer.element_size() // max(group.size(), 1)
    bounds, deadline = b.policy.bounds(b.round, b.layers, b.network, b.training)
    numels = [layer.numel for layer in b.layers]
    flat, numels, restore = _transformed(buffer, numels, state.seed, bucket.index(), b.round) if state.hadamard \
        else (buffer, numels, None)
    b.round += 1

    def done(future: torch.futures.Future) -> torch.Tensor:
        b.network.record(future.value())
        if restore is not None:
            restore()
        return buffer

    return group.allreduce_tolerant(flat, numels, bounds, deadline).then(done)


def _transformed(buffer: torch.Tensor, numels: list[int], seed: int, index: int, round: int
                 ) -> tuple[torch.Tensor, list[int], Any]:
    """Each layer of ``buffer`` under a randomized Hadamard transform (in C, `native/hadamard.c`),
    padded to whole blocks, in a new float32 CPU tensor; its layers' sizes there; and what writes
    the inverse back into ``buffer`` (on its device, in its dtype). One seed per bucket and round,
    the same on every rank; each layer's signs continue the bucket's sequence at its place."""
    bucket_seed = hash((seed, index, round)) & 0x7FFFFFFFFFFFFFFF  # (a tuple of ints hashes alike in every process)
    layers, offset, start = [], 0, 0
    for n in numels:
        block = min(1 << max(n - 1, 1).bit_length(), HADAMARD_BLOCK)
        layers.append((offset, n, start, -(-n // block) * block, block))
        offset, start = offset + n, start + -(-n // block) * block
    flat = torch.empty(start, dtype=torch.float32)
    values = flat.numpy()
    for offset, n, start, size, block in layers:
        flat[start:start + n] = buffer[offset:offset + n]
        flat[start + n:start + size] = 0.0
        _hadamard(values[start:start + size], block, bucket_seed + start, inverse=False)

    def restore() -> None:
        for offset, n, start, size, block in layers:
            _hadamard(values[start:start + size], block, bucket_seed + start, inverse=True)
            buffer[offset:offset + n] = flat[start:start + n]

    return flat, [size for _, _, _, size, _ in layers], restore


def _hadamard(x: np.ndarray, block: int, seed: int, inverse: bool) -> None:
    check(lib.p2p_hadamard(ffi.from_buffer("float[]", x), x.size, block, seed & 0xFFFFFFFFFFFFFFFF, int(inverse)))
