"""The bandwidth estimator's rules (see p2plearn.control.estimator)."""

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


def test_saturated_sample_moves_uplink_both_ways_unsaturated_is_ignored():
    est = BandwidthEstimator({0: (100.0, 100.0)}, alpha=0.5)
    est.observe(0, 1, {1: {"rate": 60.0}, 2: {"rate": 40.0 + 100.0}}, saturated=True)
    assert est.uplink[0] == 150.0
    est.observe(0, 2, {1: {"rate": 10.0}}, saturated=False)
    assert est.uplink[0] == 150.0
    est.observe(0, 3, {1: {"rate": 50.0}}, saturated=True)
    assert est.uplink[0] == 100.0


def test_downlink_needs_saturated_senders_and_loss_and_a_closed_round():
    est = BandwidthEstimator({2: (100.0, 100.0)}, alpha=1.0, loss_threshold=0.01)
    est.observe(0, 1, {2: {"rate": 20.0, "loss": 0.1}}, saturated=True)
    est.observe(1, 1, {2: {"rate": 30.0, "loss": 0.1}}, saturated=True)
    assert est.downlink[2] == 100.0  # not before every peer has reported the round
    est.close_round(1)
    assert est.downlink[2] == 50.0  # the sum of what reached it
    est.observe(0, 2, {2: {"rate": 5.0, "loss": 0.0}}, saturated=True)  # no loss: senders set the pace
    est.observe(1, 2, {2: {"rate": 5.0, "loss": 0.5}}, saturated=False)
    est.close_round(2)
    assert est.downlink[2] == 50.0


def test_load_sums_latest_in_flight_and_forgets_the_gone():
    est = BandwidthEstimator(default_rate=7.0)
    est.observe(0, 1, {2: {"in_flight_bytes": 100, "in_flight_msgs": 1}}, saturated=False)
    est.observe(1, 1, {2: {"in_flight_bytes": 50, "in_flight_msgs": 2}}, saturated=False)
    est.observe(0, 2, {2: {"in_flight_bytes": 10, "in_flight_msgs": 1}}, saturated=False)
    arrays = est.arrays(3)
    assert arrays["load"].tolist() == [0, 0, 60] and arrays["load_msgs"].tolist() == [0, 0, 3]
    assert arrays["uplink"].tolist() == [7.0, 7.0, 7.0]
    est.forget(1)
    assert est.arrays(3)["load"].tolist() == [0, 0, 10]


def test_an_interface_rate_seeds_only_what_nothing_else_did():
    est = BandwidthEstimator({0: (100.0, 200.0)}, default_rate=50.0)
    est.seed_link(0, 1e9)  # the topology's word stands
    est.seed_link(1, 1e9)
    est.seed_link(2, None)  # unknown: the default
    arrays = est.arrays(3)
    assert arrays["uplink"].tolist() == [100.0, 1e9, 50.0] and arrays["downlink"].tolist() == [200.0, 1e9, 50.0]
