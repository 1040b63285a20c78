"""The bandwidth estimator's rules (see p2plearn.control.estimator)."""

import numpy as np
import pytest

from p2plearn.control import BandwidthEstimator, seed_rates


def test_seed_rates_reads_mappings_and_topologies():
    assert seed_rates({0: {"uplink": 1, "downlink": 2}, "1": (3, 4)}) == {0: (1.0, 2.0), 1: (3.0, 4.0)}
    topology = pytest.importorskip("p2plearn.topology")
    topo = topology.Topology.from_data({"graph": {"name": "t"}, "edges": [], "nodes": [
        {"id": "a", "uplink_mbit": 8, "downlink_mbit": 16, "slots": 2}, {"id": "b", "uplink_mbit": 80, "downlink_mbit": 8}]})
    rates = seed_rates(topo)
    assert rates == {0: (1e6, 2e6), 1: (1e6, 2e6), 2: (1e7, 1e6)}
    with pytest.raises(TypeError):
        seed_rates(42)


def flows(**rates):
    """{receiver: {"paced", "rate"}} from receiver=(paced, rate) keywords r1=..., r2=..."""
    return {int(k[1:]): {"paced": p, "rate": r} for k, (p, r) in rates.items()}


def test_a_bottleneck_sample_moves_the_estimate_both_ways_a_paced_one_only_raises_it():
    est = BandwidthEstimator({0: (100.0, 100.0)}, alpha=0.5)
    est.observe(0, 1, flows(r1=(50.0, 30.0), r2=(50.0, 30.0)))  # both limited: the uplink carried 60
    est.close_round(1)
    assert est.uplink[0].rate == 80.0
    est.observe(0, 2, flows(r1=(45.0, 45.0), r2=(45.0, 45.0)))  # at the pace: at least 90
    est.close_round(2)
    assert est.uplink[0].rate == 90.0
    est.observe(0, 3, flows(r1=(40.0, 40.0)))  # a paced sample below the estimate says nothing new
    est.close_round(3)
    assert est.uplink[0].rate == 90.0
    est.observe(0, 4, flows(r1=(100.0, 0.0)))  # too short to time: no sample
    est.close_round(4)
    assert est.arrays(1)["uplink_age"].tolist() == [2.0]  # last tested (raised) at clock 2, 4 closed


def test_samples_wait_for_the_round_to_close_and_sum_what_reached_a_receiver():
    est = BandwidthEstimator({2: (100.0, 100.0)}, alpha=1.0)
    est.observe(0, 1, flows(r2=(50.0, 20.0)))
    est.observe(1, 1, flows(r2=(50.0, 30.0)))
    assert est.downlink[2].rate == 100.0  # not before every peer has reported the round
    est.close_round(1)
    assert est.downlink[2].rate == 50.0  # both its flows limited: the sum of what reached it
    assert est.downlink[2].noise > 0 and est.downlink[2].line == 100.0


def test_a_slow_receiver_lowers_its_downlink_not_its_senders_uplinks():
    rates = {r: (100.0, 100.0) for r in range(5)}
    est = BandwidthEstimator(rates, alpha=1.0)
    # 0 and 1 each send to 2, 3 and 4 at 30; receiver 4 took only 10 from each.
    for sender in (0, 1):
        est.observe(sender, 1, flows(r2=(30.0, 30.0), r3=(30.0, 30.0), r4=(30.0, 10.0)))
    est.close_round(1)
    assert est.downlink[4].rate == 20.0
    assert est.uplink[0].rate == est.uplink[1].rate == 100.0
    assert est.downlink[2].rate == est.downlink[3].rate == 100.0


def test_a_slow_sender_lowers_its_uplink_not_its_receivers_downlinks():
    rates = {r: (100.0, 100.0) for r in range(5)}
    est = BandwidthEstimator(rates, alpha=1.0)
    est.observe(0, 1, flows(r3=(40.0, 10.0), r4=(40.0, 10.0)))  # 0's uplink carried 20 of the 80 paced
    est.observe(1, 1, flows(r3=(40.0, 40.0), r4=(40.0, 40.0)))
    est.observe(2, 1, flows(r3=(40.0, 40.0), r4=(40.0, 40.0)))
    est.close_round(1)
    assert est.uplink[0].rate == 20.0
    assert est.downlink[3].rate == est.downlink[4].rate == 100.0


def test_unusable_reports_are_ignored():
    est = BandwidthEstimator({0: (100.0, 100.0)})
    est.observe(0, 1, {1: {"paced": float("inf"), "rate": 5.0}, 2: {"paced": 5.0, "rate": float("nan")}})
    est.close_round(1)
    assert est.uplink[0].rate == 100.0 and est.arrays(1)["uplink_age"].tolist() == [2.0]


def test_an_interface_rate_seeds_only_what_nothing_else_did():
    est = BandwidthEstimator({0: (100.0, 200.0)}, default_rate=50.0)
    est.seed_link(0, 1e9)  # the topology's word stands
    est.seed_link(1, 1e9)
    est.seed_link(2, None)  # unknown: the default
    arrays = est.arrays(3)
    assert arrays["uplink"].tolist() == [100.0, 1e9, 50.0] and arrays["downlink"].tolist() == [200.0, 1e9, 50.0]
    assert arrays["downlink_target"].tolist() == [200.0, 1e9, 50.0]


def test_a_flow_alone_on_both_ends_waits_for_a_second_round_that_tells_who_was_slow():
    est = BandwidthEstimator({r: (100.0, 100.0) for r in range(4)}, alpha=1.0)
    est.observe(0, 1, flows(r1=(50.0, 10.0)))  # one flow, one sender, one receiver: who was slow?
    est.close_round(1)
    assert est.uplink[0].rate == est.downlink[1].rate == 100.0
    est.observe(2, 2, flows(r1=(50.0, 10.0)))  # 1 again slow, now with another sender
    est.observe(0, 2, flows(r3=(50.0, 50.0)))  # 0 delivered at its pace
    est.close_round(2)
    assert est.downlink[1].rate == 10.0  # both of its samples count
    assert est.uplink[0].rate == 100.0 and est.uplink[2].rate == 100.0  # its partners keep theirs
    est.observe(3, 3, flows(r1=(50.0, 10.0)))  # still slow: taken at once now
    est.close_round(3)
    assert est.downlink[1].rate == 10.0 and not est.downlink[1].pending


def test_a_limited_probe_is_put_on_the_end_it_probed():
    est = BandwidthEstimator({0: (100.0, 100.0), 1: (100.0, 100.0)}, alpha=1.0)
    est.observe(0, 1, {1: {"paced": 80.0, "rate": 30.0, "probe": "downlink"}})
    est.close_round(1)
    assert est.downlink[1].rate == 30.0 and est.uplink[0].rate == 100.0


def test_probe_targets_halve_towards_a_slow_estimate_and_return_to_the_line_rate():
    est = BandwidthEstimator({0: (100.0, 100.0), 1: (100.0, 100.0)}, alpha=1.0)
    for rnd in (1, 2):
        est.observe(0, rnd, flows(r1=(50.0, 20.0)))
        est.observe(1, rnd, {0: {"paced": 50.0, "rate": 50.0}})  # keeps 0's downlink measured
        est.close_round(rnd)
    link = est.uplink[0]  # ambiguous (one flow) in round 1, confirmed in round 2: two samples
    assert link.rate == 20.0 and link.target == 40.0  # halfway to 20 twice: 100, 60, 40 (>= 1.25 x 20)
    assert est.arrays(2)["uplink_target"][0] == 40.0
    est.observe(0, 3, flows(r1=(40.0, 40.0)))  # the probe at 40 went through: the link came back
    est.close_round(3)
    assert link.rate == 40.0 and link.target == 100.0
    est.close_round(5)  # two rounds without a flow: unmeasured, so probed at the line rate
    assert est.arrays(2)["uplink_target"][0] == 100.0 and est.arrays(2)["uplink_age"][0] == 2


def test_a_successor_takes_over_estimates_and_targets_and_keeps_its_own_line_rates():
    est = BandwidthEstimator({0: (100.0, 100.0)})
    est.seed({"uplink": np.array([30.0, 50.0]), "downlink": np.array([100.0, 50.0]),
              "uplink_target": np.array([40.0, 50.0]), "downlink_target": np.array([100.0, 60.0])})
    assert est.uplink[0].rate == 30.0 and est.uplink[0].target == 40.0 and est.uplink[0].line == 100.0
    assert est.downlink[1].line == 60.0  # no line rate of its own: the target stands in



def test_a_multicast_group_counts_once_on_its_senders_uplink():
    est = BandwidthEstimator({r: (100.0, 100.0) for r in range(5)}, alpha=1.0)
    group = {j: {"paced": 30.0, "rate": rate, "multicast": True} for j, rate in ((1, 40.0), (2, 45.0), (3, 42.0))}
    est.observe(0, 1, {**group, 4: {"paced": 30.0, "rate": 40.0}})  # and one unicast copy
    est.close_round(1)
    assert est.uplink[0].rate == 100.0  # one copy at 45 and one at 40: the estimate stands (summed: 167)
    est.observe(0, 2, {**group, 4: {"paced": 30.0, "rate": 70.0}})
    est.close_round(2)
    assert est.uplink[0].rate == 115.0  # at the pace, above the estimate: it rises to 45 + 70
    assert [est.downlink[j].rate for j in (1, 2, 3)] == [100.0] * 3  # each member's downlink: its own flow


def test_a_group_slowed_by_one_member_lowers_only_that_members_downlink():
    est = BandwidthEstimator({r: (100.0, 100.0) for r in range(4)}, alpha=1.0)
    group = {j: {"paced": 30.0, "rate": rate, "multicast": True} for j, rate in ((1, 12.5), (2, 12.2), (3, 12.0))}
    for rnd in (1, 2):  # twice: an ambiguous limit counts once a second one confirms it
        # the group, paced at 30, went at 12: member 3 took no more (its downlink) and held the others back
        est.observe(0, rnd, group)
        for sender in (1, 2):  # 3 is limited with its other senders too
            est.observe(sender, rnd, {3: {"paced": 30.0, "rate": 10.0}})
        est.close_round(rnd)
    assert est.downlink[3].rate == 32.0
    assert est.downlink[1].rate == est.downlink[2].rate == 100.0
