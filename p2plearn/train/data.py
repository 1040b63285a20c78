"""Built-in data sets (generated or bundled offline; nothing is downloaded) and sharding by rank."""
from __future__ import annotations

import functools
import math
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


def stdlib_sources() -> list[str]:
    """The ``*.py`` files of the Python standard library (``sysconfig.get_paths()["stdlib"]``, without
    site-packages and dist-packages), sorted by path: the same list on every machine with the same
    Python version."""
    import sysconfig

    files = []
    for folder, subfolders, names in os.walk(sysconfig.get_paths()["stdlib"]):
        subfolders[:] = [d for d in subfolders if d not in ("site-packages", "dist-packages")]  # not walked
        files += [os.path.join(folder, name) for name in names if name.endswith(".py")]
    return sorted(files)


def stdlib_text(context: int = 128, max_bytes: int = 8_000_000, validation_fraction: float = 0.05) -> Dataset:
    """Byte-level language modelling on the Python standard library's own source files, which
    every machine with Python has offline. The files of ``stdlib_sources`` (installed packages left
    out, so they do not change it) are read in sorted path order until ``max_bytes``, joined into
    one byte stream and cut into windows of ``context + 1`` bytes: ``x`` is a window's first ``context`` bytes, ``y`` the same shifted by
    one (the next byte at every position; 256 classes). The last ``validation_fraction`` of the
    stream is held out as ``x_test``/``y_test`` (whole files, mostly: the sorted list's last ones).
    Every rank of a job on the same Python version gets the same corpus; ``shard`` deals the
    training windows to the ranks as it deals samples."""
    chunks, total = [], 0
    for path in stdlib_sources():
        if total >= max_bytes:
            break
        with open(path, "rb") as f:
            chunks.append(f.read(max_bytes - total))
        total += len(chunks[-1])
    if total < 2 * (context + 1):
        raise ValueError(f"the standard library has only {total} bytes of Python source, too few for windows "
                         f"of {context + 1}")
    stream = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).long()
    cut = len(stream) - max(context + 1, int(len(stream) * validation_fraction))

    def windows(part: torch.Tensor) -> torch.Tensor:  # non-overlapping, views of the stream
        return part.unfold(0, context + 1, context + 1)

    train, test = windows(stream[:cut]), windows(stream[cut:])
    return Dataset(train[:, :-1], train[:, 1:], test[:, :-1], test[:, 1:], 256)


def digits(test_fraction: float = 0.25, seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1,797 images, flattened to 64 features in [0, 1])."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(len(y) * (1 - test_fraction))
    return Dataset(x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]], 10)


def dirichlet_shards(labels: torch.Tensor, world_size: int, alpha: float, seed: int = 0) -> list[torch.Tensor]:
    """Non-i.i.d. shards: each rank's class mix drawn from Dirichlet(alpha) over the classes, seeded.

    Every rank gets the same number of samples (len // world_size, so that BSP peers run the same
    number of rounds), no sample goes to two ranks, and the leftover len % world_size are unused.
    The ranks take one sample each in turn, of a class drawn from their own mix among the classes
    not yet used up (a rank whose classes ran out draws from the rest), so the shards follow the
    drawn mixes except where a class is exhausted. alpha tunes the skew: 0.1 is the usual
    federated-learning benchmark (MNIST-1D on 16 ranks: 3-5 classes make 90% of a shard), 1 a
    moderate skew, 100 and above nearly the global class mix. The same labels, world_size, alpha
    and seed give the same shards on every rank."""
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"Dirichlet alpha must be a finite number > 0 (got {alpha!r}); smaller is more skewed")
    return [torch.tensor(s, dtype=torch.long)
            for s in _dirichlet_shards(labels.numpy().astype(np.int64).tobytes(), world_size, float(alpha), seed)]


@functools.lru_cache(maxsize=4)  # shard() asks again every epoch: the same shards, drawn once
def _dirichlet_shards(labels: bytes, world_size: int, alpha: float, seed: int) -> tuple[tuple[int, ...], ...]:
    rng = np.random.default_rng(seed)
    y = np.frombuffer(labels, dtype=np.int64)
    classes = int(y.max()) + 1 if len(y) else 0
    pools = [rng.permutation(np.flatnonzero(y == c)).tolist() for c in range(classes)]
    left = np.array([len(pool) for pool in pools], dtype=float)
    mixes = rng.dirichlet(np.full(classes, alpha), size=world_size)
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for _ in range(len(y) // world_size):
        for rank in range(world_size):
            weights = mixes[rank] * (left > 0)
            if not weights.sum() > 0:  # this rank's classes are used up (or its mix underflowed)
                weights = left
            c = rng.choice(classes, p=weights / weights.sum())
            shards[rank].append(pools[c].pop())
            left[c] -= 1
    return tuple(tuple(s) for s in shards)


def epoch_order(samples: int, world_size: int, *, epoch: int, seed: int,
                shards: torch.Tensor | None = None) -> torch.Tensor:
    """Every rank's sample indices for epoch `epoch`, in the order `shard` yields them: [world_size,
    per rank]. i.i.d.: equal, disjoint slices of one permutation of the `samples` (reshuffled per
    epoch); with `shards` ([world_size, per rank]: `dirichlet_shards`, stacked), each rank's shard
    reordered by one permutation of the epoch."""
    generator = torch.Generator().manual_seed(seed * 1000 + epoch)
    if shards is None:
        per_rank = samples // world_size
        return torch.randperm(samples, generator=generator)[:world_size * per_rank].view(world_size, per_rank)
    return shards[:, torch.randperm(shards.shape[1], generator=generator)]


def shard(data: Dataset, batch_size: int, *, rank: int | None = None, world_size: int | None = None,
          epoch: int = 0, seed: int = 0, dirichlet: float | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Mini-batches of this rank's shard: an equal, disjoint slice of a permutation shared by
    every rank (reshuffled per epoch). Every rank yields the same number of batches, so BSP
    peers run the same number of rounds. rank/world_size default to the launcher's, read as
    ``p2plearn.init()`` reads them (p2plearn-run, torchrun, mpirun, srun); a peer that joined a
    running job has the rank the job gave it: pass ``rank=runtime.rank``.

    dirichlet: non-i.i.d. shards instead, with class mixes drawn from Dirichlet(alpha) (see
    ``dirichlet_shards``; the shards depend on ``seed`` only, their order is reshuffled per epoch)."""
    if rank is None or world_size is None:
        from p2plearn.runtime import detect_rank

        env_rank, env_size, _, _ = detect_rank(os.environ)
        rank = env_rank if rank is None else rank
        world_size = env_size if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    shards = None if dirichlet is None else torch.stack(dirichlet_shards(data.y, world_size, dirichlet, seed))
    mine = epoch_order(len(data), world_size, epoch=epoch, seed=seed, shards=shards)[rank]
    for i in range(0, len(mine) - batch_size + 1, batch_size):
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
