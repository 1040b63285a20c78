"""Partitioned rounds in virtual time: training's scatter and gather on the simulated network."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from p2plearn.examples.mnist1d import MLP
from p2plearn.options import Options
from p2plearn.selection import NetworkView
from p2plearn.sim.simulator import PlannedSimulator
from p2plearn.sim.train import Settings, VirtualTraining
from p2plearn.topology import heterogeneous, homogeneous
from p2plearn.train.data import mnist1d


def run(topology, **options) -> VirtualTraining:
    torch.manual_seed(0)
    training = VirtualTraining(Options(sync="partitioned", period=4, **options),
                               Settings(steps=8, eval_every=8, step_s=0.002, eval_s=0.001, seed=1, message_bytes=1e6),
                               topology, mnist1d(2000, seed=0), lambda: MLP(16), "mlp-16")
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
