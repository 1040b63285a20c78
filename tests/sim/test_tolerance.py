"""Loss tolerance in virtual time: per-layer bounds and deadlines on the flow-level simulator, links
that change mid-flow, and every virtual peer's policy fed as a real peer feeds it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from p2plearn.examples.mnist1d import MLP
from p2plearn.options import Options
from p2plearn.selection import NetworkView
from p2plearn.sim import Simulator
from p2plearn.sim.tolerance import VirtualTolerance
from p2plearn.sim.train import Settings, VirtualTraining
from p2plearn.tolerance import Layer
from p2plearn.topology import microburst
from p2plearn.train.data import mnist1d

LAYERS = [Layer("w", 300, 1200, 0), Layer("b", 100, 400, 0, "bias")]  # 3/4 and 1/4 of the bytes


def ring_round(**kw):
    """One flow per sender around a ring of two peers at 1 MB/s with 1 MB messages; its flows."""
    view = NetworkView.uniform(2, 1e6, 1e6)
    return Simulator(view, policy="ring", p=1, paced=False, efficiency=1.0, **kw).run(1).flows


def test_per_layer_bounds_repair_each_layer_to_its_own_bound():
    # loss 0.2: the 3/4 layer at bound 0.3 goes once (0.75 MB), the 1/4 layer at bound 0 is
    # resent until whole (0.25 / 0.8 MB): 1.0625 s at 1 MB/s
    bounds = np.array([[0.3, 0.0], [0.3, 0.0]])
    flows = ring_round(loss=0.2, bound=bounds, layer_shares=np.array([0.75, 0.25]))
    assert flows["end_s"] == pytest.approx([0.75 + 0.25 / 0.8] * 2)
    assert flows["delivered"] == pytest.approx([0.75 * 0.8 + 0.25] * 2)
    # one bound per sender: the same as a uniform bound of that value
    per_sender = ring_round(loss=0.2, bound=np.array([0.0, 0.3]))
    assert sorted(per_sender["end_s"]) == pytest.approx([1.0, 1.0 / 0.8])


def test_per_sender_deadlines_cut_each_senders_flows():
    flows = ring_round(deadline=np.array([0.4, np.inf]))
    by_src = dict(zip(flows["src"].astype(int).tolist(), flows["end_s"].tolist()))
    assert by_src == pytest.approx({0: 0.4, 1: 1.0})


def test_a_flow_moves_at_the_new_rate_once_a_burst_begins_and_ends():
    # 1 MB/s, then 0.1 MB/s from 0.5 s to 1.5 s, then 1 MB/s: 0.5 MB + 0.1 MB + 0.4 MB -> 1.9 s
    def links(t):
        slow = 0.5 <= t < 1.5
        rate = np.full(2, 0.1e6 if slow else 1e6)
        return rate, rate, 0.5 if t < 0.5 else (1.5 if slow else np.inf)

    flows = ring_round(links=links)
    assert flows["end_s"] == pytest.approx([1.9, 1.9])
    with pytest.raises(ValueError, match="per-layer bounds"):
        Simulator(NetworkView.uniform(2, 1e6, 1e6), bound=np.zeros((2, 3)), layer_shares=np.array([0.5, 0.5]))


def test_layer_delivered_is_the_loss_or_the_bound_and_a_cut_takes_from_every_layer():
    tolerance = VirtualTolerance(Options(tolerance="layerwise"), LAYERS, 2)
    bounds = np.array([[0.3, 0.0], [0.05, 0.05]])
    whole = tolerance.layer_delivered(np.array([0, 1]), np.array([0.2, 0.2]), np.array([0.85, 0.95]), bounds)
    assert whole == pytest.approx(np.array([[0.8, 1.0], [0.95, 0.95]]))
    cut = tolerance.layer_delivered(np.array([0]), np.array([0.2]), np.array([0.425]), bounds)
    assert cut == pytest.approx(np.array([[0.4, 0.5]]))


def test_policies_are_fed_what_a_real_peer_feeds_them():
    tolerance = VirtualTolerance(Options(tolerance="adaptive"), LAYERS, 3)
    changes = np.zeros((3, 400), dtype=np.float32)
    changes[:, :300] = 1.0   # norm sqrt(300) in the weight layer
    changes[1, 300:] = 2.0   # peer 1 also moved its bias: norm 20
    tolerance.track(changes, np.array([2.0, 1.5, 1.0]))
    assert tolerance.trainings[1].layer_update_norms[-1] == pytest.approx([300 ** 0.5, 20.0])
    assert tolerance.trainings[2].losses == [1.0] and tolerance.trainings[2].losses_reported == 1
    bounds, deadlines = tolerance.bounds(0, np.full(3, 1e6), planned_s=0.5)
    assert bounds.shape == (3, 2) and deadlines.shape == (3,)
    # peer 0 sent two flows, peer 1 one, peer 2 none
    # peer 1's flow was ended by the slow close: a deadline hit, as a real peer records a "slow" send
    tolerance.observe(0, np.array([0, 0, 1]), np.array([1.0, 0.5, 0.9]), np.array([0.0, 0.1, 0.1]),
                      np.array([1.0, 2.0, 0.5]), np.array([0.0, 0.0, 1.0]), np.array([2.0, 0.9, 0.0]), np.full(3, 1e6))
    first = tolerance.networks[0].history[-1]
    assert (first.round, first.elapsed_s, first.delivered, first.loss_rate) == (0, 2.0, 0.75, pytest.approx(0.05))
    assert first.delivery_rates == pytest.approx([1e6, 0.25e6]) and first.message_bytes == 1e6
    assert 0.5 < deadlines[1] and tolerance.networks[1].history[-1].deadline_hit  # not by its deadline
    assert tolerance.networks[2].history == []


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["adaptive", "layerwise", "phase"])
def test_a_virtual_run_under_microbursts_takes_each_policys_bounds(policy):
    torch.manual_seed(0)
    data = mnist1d(2000, seed=0)
    options = Options(tolerance=policy, loss_bound=0.1, period=2, compress="none")  # per-layer masks: plain
    settings = Settings(steps=24, eval_every=12, step_s=0.002, eval_s=0.001, seed=3, message_bytes=1e6)
    run = VirtualTraining(options, settings, microburst(4, every_s=1.0, duration_s=0.3), data, lambda: MLP(16), "mlp-16")
    result = run.run()
    assert result["rounds"] == 12
    histories = [len(n.history) for n in run.tolerance.networks]
    assert all(0 < h <= 12 for h in histories)
    assert all(len(t.losses) == 12 for t in run.tolerance.trainings)
    # bursts of 20% loss: the bounds let some rounds deliver less than all
    delivered = [r["delivered"] for r in result["round_log"]]
    assert min(delivered) < 1.0
    again = VirtualTraining(options, settings, microburst(4, every_s=1.0, duration_s=0.3), data,
                            lambda: MLP(16), "mlp-16").run()
    assert again["history"] == result["history"] and again["virtual_s"] == result["virtual_s"]
