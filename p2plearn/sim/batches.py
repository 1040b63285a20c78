"""Every virtual peer's batches, as `train.data.shard` gives each rank its own, drawn for all ranks at once.

    steps, per_epoch = peer_steps(data, batch_size=32, n=256, seed=0, dirichlet=None)
    x, y = next(steps)   # x [n, batch, ...], y [n, batch]: one local step of every peer
"""
from __future__ import annotations

import torch

from p2plearn.train.data import Dataset, dirichlet_shards, epoch_order


def peer_batches(samples: int, batch_size: int, n: int, epoch: int, seed: int,
                 shards: torch.Tensor | None = None) -> torch.Tensor:
    """Sample indices [steps, n, batch] of epoch `epoch`: row [k, i] is the k-th batch
    `train.data.shard` gives rank i of n (i.i.d., or from its Dirichlet shard: `shards`, [n, per
    rank], rank i's `dirichlet_shards`), drawn once for all ranks rather than once per rank."""
    mine = epoch_order(samples, n, epoch=epoch, seed=seed, shards=shards)
    steps = mine.shape[1] // batch_size
    return mine[:, :steps * batch_size].reshape(n, steps, batch_size).transpose(0, 1)


def peer_steps(data: Dataset, batch_size: int, n: int, seed: int, dirichlet: float | None):
    """(x [n, batch, ...], y [n, batch]) per local step, every peer's from its own shard (i.i.d., or
    Dirichlet `dirichlet`), epoch after epoch; and the steps per epoch (every shard yields as many)."""
    shards = None if dirichlet is None else torch.stack(dirichlet_shards(data.y, n, dirichlet, seed))
    first = peer_batches(len(data), batch_size, n, 0, seed, shards)
    if not len(first):
        raise ValueError(f"{len(data)} training samples over {n} peers leave no batch of "
                         f"{batch_size}: give more --samples or a smaller --batch-size")

    def steps():
        e, batches = 0, first
        while True:
            for idx in batches:
                yield data.x[idx], data.y[idx]
            e += 1
            batches = peer_batches(len(data), batch_size, n, e, seed, shards)

    return steps(), len(first)
