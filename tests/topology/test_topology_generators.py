"""The topology generators."""

import pytest

from p2plearn.topology import heterogeneous, homogeneous, incast, microburst


def test_homogeneous():
    topology = homogeneous(4, mbit=250, loss=0.01)
    assert topology.peers == ["p0", "p1", "p2", "p3"]
    assert {topology.uplink_mbit(p) for p in topology.peers} == {250.0}
    assert {topology.downlink_mbit(p) for p in topology.peers} == {250.0}
    assert {topology.loss(p) for p in topology.peers} == {0.01}


def test_heterogeneous_covers_every_tier_with_asymmetric_uplinks_and_is_reproducible():
    topology = heterogeneous(8, tiers=(50, 100, 200, 500), seed=3)
    downlinks = sorted(topology.downlink_mbit(p) for p in topology.peers)
    assert downlinks == [50, 50, 100, 100, 200, 200, 500, 500]
    assert all(topology.uplink_mbit(p) <= topology.downlink_mbit(p) for p in topology.peers)
    assert any(topology.uplink_mbit(p) < topology.downlink_mbit(p) for p in topology.peers)
    assert topology.to_data() == heterogeneous(8, tiers=(50, 100, 200, 500), seed=3).to_data()
    assert topology.to_data() != heterogeneous(8, tiers=(50, 100, 200, 500), seed=4).to_data()


def test_incast_has_shallow_buffers():
    topology = incast(8, mbit=1000, buffer_kb=32)
    assert {topology.buffer_kb(p) for p in topology.peers} == {32.0}
    assert {topology.downlink_mbit(p) for p in topology.peers} == {1000.0}


def test_microburst_gives_each_peer_a_periodic_burst_within_the_period():
    topology = microburst(8, mbit=100, every_s=5, duration_s=0.25, burst_loss=0.3, burst_rate_factor=0.1)
    for peer in topology.peers:
        (event,) = topology.events(peer)
        assert event.every_s == 5 and event.duration_s == 0.25
        assert event.changes == {"downlink_mbit": pytest.approx(10.0), "loss": 0.3}
        assert 0 <= event.at_s <= 5 - 0.25
    assert len({topology.events(p)[0].at_s for p in topology.peers}) > 1  # staggered


def test_heterogeneous_bursts_hit_the_chosen_peers_downlinks_staggered_and_keep_the_base_mix():
    plain = heterogeneous(16, tiers=(25, 50, 100), up_ratios=(1.0, 0.5), seed=0)
    bursty = heterogeneous(16, tiers=(25, 50, 100), up_ratios=(1.0, 0.5), seed=0, bursty=4, every_s=10,
                           duration_s=2, burst_rate_factor=0.1)
    hit = [p for p in bursty.peers if bursty.events(p)]
    assert len(hit) == 4
    for peer in bursty.peers:  # the same rates as without bursts
        assert bursty.downlink_mbit(peer) == plain.downlink_mbit(peer)
        assert bursty.uplink_mbit(peer) == plain.uplink_mbit(peer)
    for peer in hit:
        (event,) = bursty.events(peer)
        assert event.every_s == 10 and event.duration_s == 2 and 0 <= event.at_s <= 8
        assert event.changes == {"downlink_mbit": pytest.approx(0.1 * bursty.downlink_mbit(peer))}
    assert len({bursty.events(p)[0].at_s for p in hit}) > 1  # staggered
    assert not any(plain.events(p) for p in plain.peers)
