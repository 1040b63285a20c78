"""SSP rounds (s > 0) in training and in virtual time leave the same bits, given the same choice of
messages per merge: the same models, every peer sending to every other (`--selection all`), messages in
the plain, int8 and int4 formats, exact or with the chunk masks real engines delivered.

What this pins is the arithmetic of SSP's merges, not their timing: which of the rounds r-s..r a real
peer's merge after round r takes depends on when messages arrive, so the real peers' choice is recorded
(`record_merges`: per receiver and round, the (sender, round) of each message taken) and the simulator
merges exactly those (`ReplayedMerges`). Compared: messages of several rounds merged at once, each its
sender's model of its own round (kept while it is within the bound), read with its chunk mask, in
the inbox's order, with each sender's error feedback across rounds. Which rounds the rule itself picks
is `test_window_bits.py`'s."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from p2plearn.examples.mnist1d import MLP
from p2plearn.options import Options
from p2plearn.sim.train import Settings, VirtualTraining
from p2plearn.sync import SSP
from p2plearn.tolerance import make_tolerance
from p2plearn.topology import homogeneous
from p2plearn.train.data import mnist1d
from tests.sync.recording import ReplayedMerges, record_deliveries, record_merges, replayer
from tests.sync.test_rounds import job, run_threads  # noqa: F401 - job is the fixture

PEERS = 4
STRAGGLE_S = 0.1  # the last rank's compute before every step: the others run ahead and merge its older rounds


@pytest.mark.parametrize("lossy", [False, True], ids=["exact", "lost-chunks"])
@pytest.mark.parametrize("compress", ["none", "int8", "int4"])
@pytest.mark.parametrize("staleness", [1, 2])
def test_training_and_the_simulator_end_ssp_rounds_with_the_same_bits(job, staleness, compress, lossy):  # noqa: F811
    """The simulator's peers take no local step (lr 0) and run 2 + 2s rounds (a round per step); the
    real peers run the same rounds from the same models, the last rank a straggler. With lost chunks
    (1400-byte datagrams of which the engines drop 20%, a loss bound of 0.3 closing sends early) the
    simulator is handed the masks the real receivers got."""
    rounds = 2 + 2 * staleness
    torch.manual_seed(0)
    sim = VirtualTraining(Options(sync="ssp", staleness=staleness, selection="all", period=1, compress=compress,
                                  loss_bound=0.3 if lossy else 0.0),
                          Settings(steps=rounds, eval_every=rounds, lr=0.0, step_s=0.002, eval_s=0.001, seed=1),
                          homogeneous(PEERS, 100.0), mnist1d(2000, seed=0), lambda: MLP(512), "mlp-512")
    rows = sim.replicas.numpy()
    models = np.random.default_rng(3).standard_normal(rows.shape).astype(np.float32)
    rows[...] = models
    loss = {"channel_kw": {"drop_prob": 0.2, "seed": 5, "max_datagram": 1400},
            "tolerance": make_tolerance("fixed", loss_bound=0.3)} if lossy else {}
    peers = job(PEERS, SSP, params=lambda rank: [models[rank].copy()], staleness=staleness, compress=compress,
                selection="all", **loss)
    received = record_deliveries(peers)
    merged = record_merges(peers)

    def straggle(peer):
        if peer.client.rank == PEERS - 1:
            time.sleep(STRAGGLE_S)

    run_threads(peers, rounds, before_step=straggle)
    sim.arrivals.deliver = replayer(received)
    sim.window = ReplayedMerges(sim.window, merged)
    sim.run()
    for i, peer in enumerate(peers):
        assert np.array_equal(peer.params[0], rows[i]), f"rank {i}'s model differs (merged: {merged})"
    stale = [(rank, rnd, msg_id) for (rank, rnd), got in merged.items() for _, msg_id in got if msg_id < rnd]
    assert stale, f"no merge took an earlier round's message: the test tests no more than BSP ({merged})"
    lost = sum(not received[(rank, sender, msg_id)].mask.all()
               for (rank, _), got in merged.items() for sender, msg_id in got)
    assert (lost > 0) == lossy, "the lossy case merged no message that lost chunks: it tests nothing more"
