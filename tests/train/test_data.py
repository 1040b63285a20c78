"""Sharding by rank: disjoint equal shards, with the rank read as p2plearn.init() reads it."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from p2plearn.train.data import Dataset, shard

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
