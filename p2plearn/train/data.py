"""Built-in data sets (generated or bundled offline; nothing is downloaded) and sharding by rank."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch


@dataclass
class Dataset:
    """Train and test tensors of a classification task."""

    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: int

    def __len__(self) -> int:
        return len(self.y)


def _cache_dir() -> str:
    return os.environ.get("P2PLEARN_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "p2plearn"))


def mnist1d(num_samples: int = 12000, seed: int = 42) -> Dataset:
    """MNIST-1D (Greydanus 2020), generated procedurally with `mnist1d.data.make_dataset` (never
    its download). 80% train / 20% test, sequences of length 40, 10 classes. Generating 12,000
    samples takes a few seconds, so the arrays are cached under ~/.cache/p2plearn (or
    $P2PLEARN_CACHE); every peer of a job gets the same data for the same arguments."""
    path = os.path.join(_cache_dir(), f"mnist1d-{num_samples}-{seed}.npz")
    if not os.path.exists(path):
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples, args.seed = num_samples, seed
        d = make_dataset(args)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".npz")
        os.close(fd)
        np.savez(tmp, x=d["x"], y=d["y"], x_test=d["x_test"], y_test=d["y_test"])
        os.replace(tmp, path)  # atomic: peers that generate at once never read half a file
    with np.load(path) as f:
        return Dataset(torch.tensor(f["x"], dtype=torch.float32), torch.tensor(f["y"], dtype=torch.long),
                       torch.tensor(f["x_test"], dtype=torch.float32), torch.tensor(f["y_test"], dtype=torch.long), 10)


def digits(test_fraction: float = 0.25, seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1,797 images, flattened to 64 features in [0, 1])."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(len(y) * (1 - test_fraction))
    return Dataset(x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]], 10)


def shard(data: Dataset, batch_size: int, *, rank: int | None = None, world_size: int | None = None,
          epoch: int = 0, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Mini-batches of this rank's shard: an equal, disjoint slice of a permutation shared by
    every rank (reshuffled per epoch). Every rank yields the same number of batches, so BSP
    peers run the same number of rounds. rank/world_size default to the launcher's, read as
    ``p2plearn.init()`` reads them (p2plearn-run, torchrun, mpirun, srun); a peer that joined a
    running job has the rank the job gave it: pass ``rank=runtime.rank``."""
    if rank is None or world_size is None:
        from p2plearn.runtime import detect_rank

        env_rank, env_size, _, _ = detect_rank(os.environ)
        rank = env_rank if rank is None else rank
        world_size = env_size if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    per_rank = len(data) // world_size
    mine = order[rank * per_rank:(rank + 1) * per_rank]
    for i in range(0, per_rank - batch_size + 1, batch_size):
        idx = mine[i:i + batch_size]
        yield data.x[idx], data.y[idx]


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of x classified as y (evaluation mode, no gradients)."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        acc = float((model(x).argmax(1) == y).float().mean())
    model.train(was_training)
    return acc
