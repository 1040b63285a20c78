"""BSP rounds in training and in virtual time leave the same bits: the same models, every peer sending
to every other (`--selection all`, so the plan does not depend on the view), messages in the plain,
int8 and int4 formats, exact or with the chunk masks real engines delivered."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from p2plearn.examples.mnist1d import MLP
from p2plearn.options import Options
from p2plearn.sim.train import Settings, VirtualTraining
from p2plearn.sync import BSP
from p2plearn.tolerance import make_tolerance
from p2plearn.topology import homogeneous
from p2plearn.train.data import mnist1d
from tests.sync.recording import record_deliveries, replayer
from tests.sync.test_rounds import job, run_threads  # noqa: F401 - job is the fixture

ROUNDS = 3


@pytest.mark.parametrize("lossy", [False, True], ids=["exact", "lost-chunks"])
@pytest.mark.parametrize("compress", ["none", "int8", "int4"])
def test_training_and_the_simulator_end_bsp_rounds_with_the_same_bits(job, compress, lossy):  # noqa: F811
    """The simulator's peers take no local step (lr 0) and run ROUNDS rounds (a round per step); the
    real peers run the same rounds from the same models. With lost chunks (1400-byte datagrams of which
    the engines drop 20%, a loss bound of 0.3 closing sends early) the simulator is handed the masks the
    real receivers got, plain float32 messages too (read with training's codec); exact plain rounds
    take the simulator's own path (its draw, which delivers all of an exact flow)."""
    torch.manual_seed(0)
    sim = VirtualTraining(Options(sync="bsp", selection="all", period=1, compress=compress,
                                  loss_bound=0.3 if lossy else 0.0),
                          Settings(steps=ROUNDS, eval_every=ROUNDS, lr=0.0, step_s=0.002, eval_s=0.001, seed=1),
                          homogeneous(4, 100.0), mnist1d(2000, seed=0), lambda: MLP(512), "mlp-512")
    rows = sim.replicas.numpy()
    models = np.random.default_rng(3).standard_normal(rows.shape).astype(np.float32)
    rows[...] = models
    loss = {"channel_kw": {"drop_prob": 0.2, "seed": 5, "max_datagram": 1400},
            "tolerance": make_tolerance("fixed", loss_bound=0.3)} if lossy else {}
    peers = job(4, BSP, params=lambda rank: [models[rank].copy()], compress=compress, selection="all", **loss)
    received = record_deliveries(peers)
    run_threads(peers, ROUNDS)
    if lossy or compress != "none":
        sim.arrivals.deliver = replayer(received)
    sim.run()
    for i, peer in enumerate(peers):
        assert np.array_equal(peer.params[0], rows[i]), f"rank {i}'s model differs"
    lost = sum(not d.mask.all() for d in received.values())
    assert (lost > 0) == lossy, "the lossy case lost no chunk: it tests nothing more"
