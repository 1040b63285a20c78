"""Sharding by rank: disjoint equal shards, with the rank read as p2plearn.init() reads it."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from p2plearn.train.data import Dataset, dirichlet_shards, shard

ROWS = 96


def numbered() -> Dataset:
    """Row i holds the number i, so a batch tells which rows it has."""
    x = torch.arange(ROWS, dtype=torch.float32).unsqueeze(1)
    return Dataset(x, torch.zeros(ROWS, dtype=torch.long), x[:1], torch.zeros(1, dtype=torch.long), classes=1)


def rows_of(batches) -> list[int]:
    return [int(v) for x, _ in batches for v in x[:, 0]]


def test_shards_are_disjoint_equal_and_cover_the_data():
    shards = [rows_of(shard(numbered(), 4, rank=r, world_size=3, epoch=1)) for r in range(3)]
    assert all(len(s) == ROWS // 3 for s in shards)
    assert sorted(sum(shards, [])) == list(range(ROWS))


@pytest.mark.parametrize("variables", [
    {"RANK": "2", "WORLD_SIZE": "4"},
    {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"},
    {"PMI_RANK": "2", "PMI_SIZE": "4"},
    {"SLURM_PROCID": "2", "SLURM_NTASKS": "4"},
])
def test_the_rank_comes_from_any_launcher(monkeypatch, variables):
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                 "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert rows_of(shard(numbered(), 4)) == rows_of(shard(numbered(), 4, rank=2, world_size=4))


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Open MPI) is not installed")
def test_under_real_open_mpi_each_rank_gets_its_own_shard(tmp_path):
    # Each rank writes a file of its own: mpirun interleaves the ranks' stdout mid-line.
    code = ("import os, sys; sys.path.insert(0, %r); from test_data import numbered, rows_of; "
            "from p2plearn.train.data import shard; rank = os.environ['OMPI_COMM_WORLD_RANK']; "
            "open(os.path.join(%r, 'rank-' + rank), 'w').write(' '.join(map(str, rows_of(shard(numbered(), 4)))))"
            % (os.path.dirname(os.path.abspath(__file__)), str(tmp_path)))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, "-c", code],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    shards = [[int(v) for v in (tmp_path / f"rank-{r}").read_text().split()] for r in range(2)]
    assert all(len(s) == ROWS // 2 for s in shards), shards
    assert sorted(shards[0] + shards[1]) == list(range(ROWS))


def labelled(per_class: int = 200, classes: int = 10) -> Dataset:
    """Row i holds the number i; labels cycle through the classes."""
    n = per_class * classes
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    return Dataset(x, torch.arange(n) % classes, x[:1], torch.zeros(1, dtype=torch.long), classes=classes)


def dirichlet_rows(data: Dataset, alpha: float, seed: int = 0, world: int = 8, epoch: int = 0) -> list[list[int]]:
    return [rows_of(shard(data, 10, rank=r, world_size=world, epoch=epoch, seed=seed, dirichlet=alpha))
            for r in range(world)]


def class_shares(data: Dataset, shards: list[torch.Tensor]) -> torch.Tensor:
    """Per shard, the fraction of its samples in each class (rows: shards)."""
    counts = torch.stack([torch.bincount(data.y[s], minlength=data.classes) for s in shards]).float()
    return counts / counts.sum(1, keepdim=True)


def test_dirichlet_shards_are_deterministic_for_a_seed_and_differ_across_seeds():
    data = labelled()
    assert dirichlet_rows(data, 0.1, seed=3) == dirichlet_rows(data, 0.1, seed=3)
    assert dirichlet_rows(data, 0.1, seed=3) != dirichlet_rows(data, 0.1, seed=4)
    # Another epoch reorders each shard, it does not change it.
    assert [sorted(s) for s in dirichlet_rows(data, 0.1, seed=3, epoch=1)] == \
        [sorted(s) for s in dirichlet_rows(data, 0.1, seed=3, epoch=0)]


def test_dirichlet_shards_are_equal_and_use_every_sample_at_most_once():
    data = labelled()
    shards = dirichlet_shards(data.y, 7, 0.1, seed=1)
    assert {len(s) for s in shards} == {len(data) // 7}
    used = torch.cat(shards).tolist()
    assert len(used) == len(set(used))


def test_dirichlet_alpha_tunes_the_class_skew():
    data = labelled()
    skewed = class_shares(data, dirichlet_shards(data.y, 8, 0.1, seed=0))
    uniform = class_shares(data, dirichlet_shards(data.y, 8, 1000.0, seed=0))
    # At 0.1 each shard is dominated by a few classes; at 1000 each is close to the global 10% per class.
    assert skewed.max(1).values.median() > 0.3
    assert (skewed.topk(4, dim=1).values.sum(1) > 0.8).all()
    assert (uniform - 0.1).abs().max() < 0.05


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_dirichlet_alpha_is_refused_with_a_clear_error(alpha):
    with pytest.raises(ValueError, match="Dirichlet alpha must be a finite number > 0"):
        dirichlet_shards(labelled().y, 4, alpha)
    with pytest.raises(ValueError, match="Dirichlet alpha"):
        next(shard(labelled(), 4, rank=0, world_size=4, dirichlet=alpha))
