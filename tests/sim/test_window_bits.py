"""Training and the simulator merge by the same rule (`sync.window.MergeWindow`): SSP rounds with a
straggler leave the same bits in both, the simulator choosing the messages of each merge by itself.

Two peers, rank 1 a straggler (it computes SLOW_S before every step, rank 0 nothing), so rank 0
runs up to s rounds ahead and each merge takes messages of earlier rounds: which ones is the rule's
decision (a message arrives a straggler's step or more before or after the merge that could take it,
so the real run decides as the virtual one does). The arithmetic of SSP merges with compression and
lost chunks, the choice of messages replayed, is `test_ssp_bits.py`'s; plain BSP rounds with lost
chunks are `test_bsp_bits.py`'s."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from p2plearn.examples.mnist1d import MLP
from p2plearn.options import Options
from p2plearn.sim.train import Settings, VirtualTraining
from p2plearn.sync import SSP
from p2plearn.topology import homogeneous
from p2plearn.train.data import mnist1d
from tests.sync.test_rounds import job, run_threads  # noqa: F401 - job is the fixture

FAST_S = 0.002
SLOW_S = 0.3  # a straggler's step: far longer than a round's transfer and the threads' jitter


def virtual(options: Options, peers: int, rounds: int) -> VirtualTraining:
    """A simulator of `peers` peers that take no local step (lr 0), a round per step, from random models."""
    torch.manual_seed(0)
    sim = VirtualTraining(options, Settings(steps=rounds, eval_every=rounds, lr=0.0, step_s=FAST_S, eval_s=0.0, seed=1),
                          homogeneous(peers, 100.0), mnist1d(2000, seed=0), lambda: MLP(512), "mlp-512")
    rows = sim.replicas.numpy()
    rows[...] = np.random.default_rng(3).standard_normal(rows.shape).astype(np.float32)
    return sim


@pytest.mark.parametrize("staleness", [1, 2])
def test_ssp_with_a_straggler_merges_the_same_rounds_in_training_and_in_the_simulator(job, staleness):  # noqa: F811
    rounds = 3 + 2 * staleness
    sim = virtual(Options(sync="ssp", staleness=staleness, selection="all", period=1, compress="none"), 2, rounds)
    sim.step_s = np.array([FAST_S, SLOW_S])
    models = sim.replicas.numpy().copy()
    peers = job(2, SSP, params=lambda rank: [models[rank].copy()], staleness=staleness, selection="all")
    merged: list[list[int]] = [[], []]  # per rank, the messages each round merged

    def straggle(peer):
        if peer.client.rank == 1:
            time.sleep(SLOW_S)

    def count(stats):
        merged[stats.receivers[0] ^ 1].append(stats.merged)  # two peers: each sends to the other only

    run_threads(peers, rounds, before_step=straggle, after_step=count)
    sim.run()
    rows = sim.replicas.numpy()
    assert merged[0][0] == 0 and merged[1][0] == 1, merged  # rank 0 ran ahead: its round 0 had no input yet
    for i, peer in enumerate(peers):
        assert np.array_equal(peer.params[0], rows[i]), f"rank {i}'s model differs (merged per round: {merged})"
    assert not np.array_equal(rows[0], models[0]), "nothing was merged: the test tests nothing"

