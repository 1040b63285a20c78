"""The simulator on hand-computed cases (no root)."""
import time

import numpy as np
import pytest

from p2plearn.selection import PACING_HEADROOM, POLICIES, NetworkView, SelectionPolicy
from p2plearn.sim import WIRE_EFFICIENCY, Simulator, max_min_rates
from p2plearn.topology import heterogeneous


def test_one_bottleneck_shared_equally():
    # Three flows into receiver 3 (downlink 30); senders' uplinks are ample.
    rates = max_min_rates([0, 1, 2], [3, 3, 3], np.full(4, 100.0), np.array([100, 100, 100, 30.0]))
    assert rates == pytest.approx([10, 10, 10])


def test_two_bottlenecks():
    # Sender 0 (uplink 10) feeds receivers 1 and 2; sender 3 also feeds 2 (downlink 20).
    # 0's uplink fills first at 5 each; flow 3->2 then takes what 2's downlink leaves: 15.
    up = np.array([10.0, 100, 100, 100])
    down = np.array([100.0, 100, 20, 100])
    rates = max_min_rates([0, 0, 3], [1, 2, 2], up, down)
    assert rates == pytest.approx([5, 5, 15])


def test_flow_limited_by_its_cap():
    # Two flows into downlink 10; one capped at 2, so the other gets the remaining 8.
    rates = max_min_rates([0, 1], [2, 2], np.full(3, 100.0), np.array([100, 100, 10.0]), cap=np.array([2, np.inf]))
    assert rates == pytest.approx([2, 8])


def test_shared_link_caps_the_sum_and_leaves_slower_flows_alone():
    # Flow 0->1 is held at 2 by its uplink; a shared link of 12 leaves 10 for the other two: 5 each.
    up = np.array([2.0, 100, 100, 100])
    rates = max_min_rates([0, 2, 3], [1, 0, 1], up, np.full(4, 100.0), shared=12.0)
    assert rates == pytest.approx([2, 5, 5])


def test_host_rate_slows_a_round_only_when_it_binds():
    # 16 peers, p=3 at 12.5 MB/s each: the paced flows move 200 MB/s in all.
    view = NetworkView.uniform(16, 12.5e6, 2e6)
    free = Simulator(view, policy="random", p=3).run(2).rounds[0].time_s
    loose = Simulator(view, policy="random", p=3, host_rate=400e6).run(2).rounds[0].time_s
    tight = Simulator(view, policy="random", p=3, host_rate=60e6).run(2).rounds[0].time_s
    assert loose == pytest.approx(free)
    # Every flow then gets 60/48 MB/s, below every pacing cap: the round moves 16 x 3 x 2 MB of
    # frames at 60 MB/s.
    assert tight == pytest.approx(16 * 3 * 2e6 / WIRE_EFFICIENCY / 60e6)


class Star(SelectionPolicy):
    """Everyone sends to peer 0 (a star into one downlink)."""

    name = "star"

    def plan(self, view, p, round):
        return {i: ([0] if i else []) for i in range(view.n)}


@pytest.fixture
def star(monkeypatch):
    monkeypatch.setitem(POLICIES, "star", Star)


def _view(up, down, size):
    up, down = np.asarray(up, float), np.asarray(down, float)
    return NetworkView(up, down, np.full(len(up), float(size)), np.ones(len(up), dtype=bool))


def test_bsp_round_is_the_slowest_flow_on_a_star(star):
    # Senders 1..3 with uplinks 1, 2, 4 MB/s into a 6 MB/s downlink (paced at 2 each, less the
    # headroom): unpaced, max-min gives 1, 2.5, 2.5; the slowest flow (1 MB at 1 MB/s) sets the round.
    view = _view([10e6, 1e6, 2e6, 4e6], [6e6] * 4, 1e6)
    unpaced = Simulator(view, policy="star", paced=False).run(3)
    assert [r.time_s for r in unpaced.rounds] == pytest.approx([1 / WIRE_EFFICIENCY] * 3)
    paced = Simulator(view, policy="star").run(1)
    assert paced.rounds[0].time_s == pytest.approx(1e6 / (PACING_HEADROOM * 1e6) / WIRE_EFFICIENCY)


def test_paced_homogeneous_matches_plan_time():
    view = NetworkView.uniform(16, 12.5e6, 2e6)
    result = Simulator(view, policy="random", p=3).run(4)
    for r in result.rounds:
        assert r.time_s == pytest.approx(r.planned_s / PACING_HEADROOM / WIRE_EFFICIENCY)
        assert r.average_p == 3 and r.delivered == 1.0


def test_ssp_with_zero_staleness_is_bsp():
    view = heterogeneous(32, seed=3)
    kw = dict(policy="random", p=2, compute_s=0.2, compute_spread=0.5, jitter=0.3, seed=1)
    bsp = Simulator.from_topology(view, 1e6, sync="bsp", **kw).run(6)
    ssp0 = Simulator.from_topology(view, 1e6, sync="ssp", staleness=0, **kw).run(6)
    assert [r.end_s for r in ssp0.rounds] == pytest.approx([r.end_s for r in bsp.rounds])
    ssp2 = Simulator.from_topology(view, 1e6, sync="ssp", staleness=2, **kw).run(6)
    assert ssp2.total_s < bsp.total_s   # stragglers no longer hold everyone back


def test_early_close_shortens_rounds_under_loss():
    view = NetworkView.uniform(8, 12.5e6, 1e6)
    exact = Simulator(view, loss=0.05, policy="ring", p=1).run(2)
    early = Simulator(view, loss=0.05, policy="ring", p=1, bound=0.05).run(2)
    # Exact delivery resends the lost 5%: 1 / 0.95 of the bytes; Early Close stops after one pass.
    assert exact.rounds[0].time_s == pytest.approx(early.rounds[0].time_s / 0.95)
    assert exact.rounds[0].delivered == pytest.approx(1.0)
    assert early.rounds[0].delivered == pytest.approx(0.95)


def test_deadline_cuts_and_reports_the_fraction():
    view = NetworkView.uniform(4, 1e6, 1e6)          # 1 MB paced at 0.95 MB/s: about 1.1 s on the wire
    result = Simulator(view, policy="ring", p=1, deadline=0.5).run(2)
    assert result.rounds[0].time_s == pytest.approx(0.5)
    assert result.rounds[0].delivered == pytest.approx(0.5 * PACING_HEADROOM * WIRE_EFFICIENCY)


def test_thousand_peers_smoke():
    t = time.perf_counter()
    result = Simulator.from_topology(heterogeneous(1000), 1e6, policy="selmcast", p=3).run(5)
    assert time.perf_counter() - t < 30
    summary = result.summary()
    assert summary["average_p"] >= 3 and summary["mean_round_s"] > 0 and summary["delivered"] == 1.0
