"""Partitioned rounds in virtual time: training's scatter and gather on the simulated network."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from p2plearn.sync.partitioned import FILTER_REFUSED, Partitioned
from p2plearn.tolerance import make_tolerance
from tests.sync.recording import record_deliveries, replayer
from tests.sync.test_rounds import job, run_threads  # noqa: F401 - job is the fixture

from p2plearn.examples.mnist1d import MLP
from p2plearn.options import Options
from p2plearn.selection import NetworkView
from p2plearn.sim.simulator import PlannedSimulator
from p2plearn.sim.train import Settings, VirtualTraining
from p2plearn.topology import heterogeneous, homogeneous
from p2plearn.train.data import mnist1d


def virtual(topology, message_bytes: float | None = 1e6, hidden: int = 16, **options) -> VirtualTraining:
    torch.manual_seed(0)
    return VirtualTraining(Options(sync="partitioned", period=4, **{"compress": "none", **options}),
                           Settings(steps=8, eval_every=8, step_s=0.002, eval_s=0.001, seed=1,
                                    message_bytes=message_bytes),
                           topology, mnist1d(2000, seed=0), lambda: MLP(hidden), f"mlp-{hidden}")


def run(topology, **options) -> VirtualTraining:
    training = virtual(topology, **options)
    training.result = training.run()
    return training


def test_exact_partitioned_rounds_leave_every_peer_the_full_average():
    training = run(heterogeneous(5))  # unequal links: unequal parts, and a peer may aggregate none
    rows = training.replicas.numpy()
    assert training.result["rounds"] == 2 and training.result["average_p"] == 4.0
    assert np.abs(rows - rows[0]).max() < 1e-5       # the last step was a round: all hold the average
    assert training.result["delivered"] == 1.0


def test_a_round_takes_what_the_two_phases_move():
    # 4 peers at 100 Mbit/s, equal parts of 1 MB: each link moves (n - 1) / n of it each phase
    training = run(homogeneous(4, 100.0))
    log = training.result["round_log"]
    one_phase = 0.75e6 / (100e6 / 8)
    assert all(2 * one_phase < r["end_s"] - (log[k - 1]["end_s"] if k else 0) < 4 * one_phase + 0.05
               for k, r in enumerate(log))


def test_lost_chunks_keep_the_receivers_own_values():
    training = run(homogeneous(4, 100.0, loss=0.2), loss_bound=0.3)
    rows = training.replicas.numpy()
    assert training.result["delivered"] < 0.9
    assert np.abs(rows - rows[0]).max() > 1e-4       # pieces lost in the gather: the models differ


def test_a_flow_paced_at_zero_is_refused():
    view = NetworkView.uniform(2, 1e6, 1e6)
    with pytest.raises(ValueError, match="never ends"):
        PlannedSimulator(view, {0: [1]}, (np.array([0]), np.array([1]), np.array([0.0])))


@pytest.mark.parametrize("compress", ["none", "int8", "int4"])
def test_compressed_partitioned_rounds_run_in_virtual_time(compress):
    training = run(heterogeneous(5), compress=compress)
    rows = training.replicas.numpy()
    assert training.result["rounds"] == 2 and training.result["delivered"] == 1.0
    assert np.abs(rows - rows[0]).max() == 0.0  # exact rounds: every peer reads the same decoded average
    plain = run(heterogeneous(5))
    # round 0 resyncs at 8 bits (1/127 of a block's largest value), round 1 rounds the change (int4: 1/14 of it)
    error = np.abs(rows[0] - plain.replicas.numpy()[0]).max() / np.abs(plain.replicas.numpy()[0]).max()
    assert error < {"none": 1e-6, "int8": 1e-2, "int4": 5e-2}[compress]
    if compress != "none":  # a round's messages are the format's bytes, not float32's
        log = training.result["round_log"]
        plain_log = plain.result["round_log"]
        assert log[1]["end_s"] - log[0]["end_s"] < plain_log[1]["end_s"] - plain_log[0]["end_s"]


def test_the_value_filter_is_refused_with_trainings_message():
    with pytest.raises(ValueError) as refused:
        virtual(homogeneous(4, 100.0), filter="value")
    assert str(refused.value) == FILTER_REFUSED


@pytest.mark.parametrize("lossy", [False, True], ids=["exact", "lost-chunks"])
@pytest.mark.parametrize("compress", ["none", "int8", "int4"])
def test_training_and_the_simulator_end_rounds_with_the_same_bits(job, compress, lossy):  # noqa: F811
    """The same models, the same view: training's partitioned rounds over real engines and the
    simulator's rounds give bit-identical models, round after round (round 0 resyncs, the next ones
    exchange compressed changes with error feedback on both sides). With lost chunks (1400-byte
    datagrams of which the engines drop 20%, a loss bound of 0.3 that closes sends early), the
    simulator is handed the chunk masks the real receivers got, so any difference is in what each side
    does with them."""
    sim = virtual(homogeneous(4, 100.0), message_bytes=None, hidden=512 if lossy else 16, compress=compress)
    rows = sim.replicas.numpy()
    models = np.random.default_rng(3).standard_normal(rows.shape).astype(np.float32)
    rows[...] = models
    if sim.anchors is not None:
        sim.anchors[...] = models
    loss = {"channel_kw": {"drop_prob": 0.2, "seed": 5, "max_datagram": 1400}, "tolerance": make_tolerance("fixed", loss_bound=0.3)} \
        if lossy else {}
    peers = job(4, Partitioned, params=lambda rank: [models[rank].copy()], compress=compress, **loss)
    received = record_deliveries(peers)

    sim.arrivals.deliver = replayer(received)
    masks_with_losses = 0
    for rnd in range(3):
        run_threads(peers, 1)
        masks_with_losses += sum(not d.mask.all() for (_, _, m), d in received.items() if m // 2 == rnd)
        view = peers[0].client.view_for(rnd)
        sizes = np.full(sim.n, sim.partitioned.message_bytes)
        sim.partitioned.round(rnd, np.zeros(sim.n), sizes, view)
        if sim.anchors is not None:
            sim.anchors[...] = rows
        for i, peer in enumerate(peers):
            assert np.array_equal(peer.params[0], rows[i]), f"round {rnd}: rank {i}'s model differs"
        rows += np.random.default_rng(10 + rnd).standard_normal(rows.shape).astype(np.float32) * 1e-2
        for i, peer in enumerate(peers):  # the same local steps on both sides
            peer.params[0][...] = rows[i]
    assert (masks_with_losses > 0) == lossy, "the lossy case lost no chunk: it tests nothing more"
