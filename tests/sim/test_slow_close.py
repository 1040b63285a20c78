"""The slow close in virtual time: a paced flow whose projected end passes S x its planned time is
cut as at a deadline (`Simulator(slow_close=S)`, `--slow-close`)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from p2plearn.examples.mnist1d import MLP
from p2plearn.options import Options
from p2plearn.selection import NetworkView
from p2plearn.sim import WIRE_EFFICIENCY, Simulator
from p2plearn.sim.links import LinkSchedule
from p2plearn.sim.train import Settings, VirtualTraining
from p2plearn.topology import heterogeneous, microburst
from p2plearn.train.data import mnist1d


def collapse(factor: float, at: float = 0.5, until: float = 20.0):
    """Links of 1 MB/s whose rates fall to `factor` of that from `at` to `until`."""
    def links(t):
        on = at <= t < until
        rate = np.full(2, 1e6 * (factor if on else 1.0))
        return rate, rate, at if t < at else (until if on else np.inf)
    return links


def ring_round(**kw):
    """One 1 MB message each way between two peers at 1 MB/s, paced (0.95 MB/s), no framing; its flows."""
    view = NetworkView.uniform(2, 1e6, 1e6)
    return Simulator(view, policy="ring", p=1, efficiency=1.0, **kw).run(1).flows


def test_a_flow_whose_link_collapses_is_cut_at_the_projection():
    off = ring_round(links=collapse(0.1))
    cap = off["cap"][0]
    moved = 0.5 * cap
    # off: at 0.1 MB/s from 0.5 s the rest takes 10x as long
    assert off["end_s"] == pytest.approx([0.5 + (1e6 - moved) / 0.1e6] * 2)
    assert off["slow"].tolist() == [0.0, 0.0]
    cut = ring_round(links=collapse(0.1), slow_close=1.5)
    # projected at 0.5 s: 0.5 + 0.525 MB / 0.1 MB/s = 5.75 s, past 1.5 x 1.05 s: cut there
    assert cut["end_s"] == pytest.approx([0.5, 0.5])
    assert cut["slow"].tolist() == [1.0, 1.0]
    assert cut["delivered"] == pytest.approx([moved / 1e6] * 2)
    assert cut["rate"] == pytest.approx([cap, cap])  # the rate it measured, for the view


def test_a_flow_still_within_its_bound_is_not_cut():
    # at 0.8 MB/s from 0.5 s: projected 0.5 + 0.525 / 0.8 = 1.16 s, within 1.5 x 1.05 s
    flows = ring_round(links=collapse(0.8), slow_close=1.5)
    assert flows["end_s"] == pytest.approx([0.5 + (1e6 - 0.5 * flows["cap"][0]) / 0.8e6] * 2)
    assert flows["slow"].tolist() == [0.0, 0.0]
    # a tighter S cuts the same flow
    tight = ring_round(links=collapse(0.8), slow_close=1.0)
    assert tight["end_s"] == pytest.approx([0.5, 0.5]) and tight["slow"].tolist() == [1.0, 1.0]


def test_a_flow_that_starts_in_a_collapse_is_cut_as_it_starts_and_reports_its_rate():
    flows = ring_round(links=collapse(0.1, at=0.0), slow_close=2.0)
    assert flows["end_s"] == pytest.approx([0.0, 0.0])
    assert flows["delivered"] == pytest.approx([0.0, 0.0])
    assert flows["rate"] == pytest.approx([0.1e6, 0.1e6])


def test_a_flow_whose_rate_stops_is_cut_at_once():
    flows = ring_round(links=collapse(0.0), slow_close=100.0)
    assert flows["end_s"] == pytest.approx([0.5, 0.5]) and flows["slow"].tolist() == [1.0, 1.0]


def test_a_deadline_before_the_slow_close_is_a_deadline():
    flows = ring_round(links=collapse(0.1, at=0.2), slow_close=1.5, deadline=0.1)
    assert flows["end_s"] == pytest.approx([0.1, 0.1]) and flows["slow"].tolist() == [0.0, 0.0]


def test_loss_beyond_s_minus_one_is_cut_as_it_starts():
    # exact delivery at loss 0.5 resends as much again: projected 2x the plan, past 1.5x
    assert ring_round(loss=0.5, slow_close=1.5)["slow"].tolist() == [1.0, 1.0]
    assert ring_round(loss=0.2, slow_close=1.5)["slow"].tolist() == [0.0, 0.0]


def test_unpaced_flows_have_no_plan_and_no_slow_close():
    flows = ring_round(links=collapse(0.1), slow_close=1.5, paced=False)
    assert flows["slow"].tolist() == [0.0, 0.0]
    assert flows["end_s"] == pytest.approx([0.5 + 0.5e6 / 0.1e6] * 2)


def test_flows_on_plan_are_untouched_even_at_s_1():
    """Paced flows that keep their pace end exactly at their plan: S = 1 changes nothing there."""
    kw = dict(policy="selmcast", p=1, loss=0.0, compute_s=0.1, compute_spread=0.5, seed=2)
    topology = heterogeneous(32, seed=3)
    off = Simulator.from_topology(topology, 1e6, **kw).run(4)
    on = Simulator.from_topology(topology, 1e6, slow_close=1.0, **kw).run(4)
    assert [r.end_s for r in on.rounds] == [r.end_s for r in off.rounds]
    for key in off.flows:
        assert np.array_equal(on.flows[key], off.flows[key]), key
    assert not off.flows["slow"].any()


def test_slow_close_must_be_off_or_at_least_one():
    with pytest.raises(ValueError, match="slow_close"):
        Simulator(NetworkView.uniform(2, 1e6, 1e6), slow_close=0.5)


def virtual_run(slow_close: float, sync: str = "bsp") -> dict:
    """24 steps of 4 peers under microbursts, 1 MB messages, a round every 2 steps."""
    torch.manual_seed(0)
    settings = Settings(steps=24, eval_every=12, step_s=0.002, eval_s=0.001, seed=3, message_bytes=1e6)
    return VirtualTraining(Options(period=2, sync=sync, slow_close=slow_close), settings,
                           microburst(4, every_s=1.0, duration_s=0.3), mnist1d(2000, seed=0), lambda: MLP(16),
                           "mlp-16").run()


def test_a_virtual_run_under_bursts_slow_closes_and_its_rounds_keep_nearer_their_plan():
    off, on = virtual_run(0.0), virtual_run(1.5)
    assert off["slow_closed"] == 0 and all(r["slow"] == 0 for r in off["round_log"])
    assert on["slow_closed"] > 0 and on["slow_closed"] == sum(r["slow"] for r in on["round_log"])
    assert on["send_over_plan"] < off["send_over_plan"]
    assert on["virtual_s"] < off["virtual_s"]


def test_partitioned_rounds_slow_close_in_each_phase():
    off, on = virtual_run(0.0, "partitioned"), virtual_run(1.5, "partitioned")
    assert off["slow_closed"] == 0 < on["slow_closed"]
    assert on["virtual_s"] < off["virtual_s"]


@pytest.mark.parametrize("slow_close", [1.0, 1.5, 3.0])
def test_under_bursts_no_flow_outlives_s_times_its_plan(slow_close):
    topology = heterogeneous(32, seed=1, bursty=12, every_s=2.0, duration_s=0.5)
    links = LinkSchedule(topology)
    kw = dict(policy="selmcast", p=1, loss=0.0, compute_s=0.05, compute_spread=0.3, seed=4,
              links=links.from_time(0.0))
    off = Simulator.from_topology(topology, 1e6, **kw).run(8)
    on = Simulator.from_topology(topology, 1e6, slow_close=slow_close, **kw).run(8)
    planned = 1e6 / WIRE_EFFICIENCY / on.flows["cap"]
    assert (on.flows["end_s"] - on.flows["start_s"] <= slow_close * planned * (1 + 1e-9)).all()
    assert on.flows["slow"].any() and not off.flows["slow"].any()
    # what a cut flow delivered is what it moved by then
    slow = on.flows["slow"] == 1
    assert (on.flows["delivered"][slow] < 1 - 1e-9).all()
    assert on.flows["delivered"][~slow] == pytest.approx(np.ones((~slow).sum()))
    assert on.total_s < off.total_s
