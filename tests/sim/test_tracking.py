"""The view follows a burst in simulation (p2plearn.sim.tracking): the closed loop of plan, paced
flows, ACK-timed rates and estimation, with plans made from the view of 2 rounds before."""
import numpy as np
import pytest

from p2plearn.sim.tracking import Burst, FlowNetwork, summary, track
from p2plearn.topology import load
from p2plearn.sim.validate import TOPOLOGY_DIR

RATE = 100e6 / 8


def run(burst, p, size=1e6, seed=0, n=8, rounds=30):
    up, down = np.full(n, RATE), np.full(n, RATE)
    return track(FlowNetwork(up, down, [burst]), up, down, [burst], rounds, message_bytes=size, p=p, seed=seed)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("burst", [Burst(3, 8, 13, 0.2), Burst(5, 8, 13, 0.41), Burst(1, 8, 13, 0.3, uplink=True),
                                   Burst(6, 8, 13, 0.1, uplink=True)])
def test_estimates_fall_within_3_rounds_of_a_burst_and_are_all_back_within_10_rounds(burst, p, seed):
    trace = run(burst, p, seed=seed)
    s = summary(trace, burst)
    assert s["falls_within_rounds"] is not None and s["falls_within_rounds"] <= 3, s
    assert s["recovers_within_rounds"] is not None and s["recovers_within_rounds"] <= 10, s


@pytest.mark.parametrize("p", [1, 2])
def test_a_burst_on_one_end_never_lowers_another(p):
    burst = Burst(3, 8, 13, 0.2)
    up_err, down_err = run(burst, p).error()
    assert np.abs(up_err).max() == 0.0  # no sender's uplink is cut for its slow receiver
    assert np.abs(np.delete(down_err, 3, axis=1)).max() == 0.0


def test_on_a_heterogeneous_topology_a_slow_peer_is_found_and_recovered():
    topo = load(TOPOLOGY_DIR / "heterogeneous-8.json")
    up = np.array([topo.uplink_bytes_per_s(x) for x in topo.peers])
    down = np.array([topo.downlink_bytes_per_s(x) for x in topo.peers])
    # Peer 0's 50 Mbit/s downlink at a fifth. (A peer far faster than the others, such as peer 3's
    # 200 Mbit/s downlink, is found again only up to what its senders can offer it beside their
    # planned flows: 64-74% of its rate; see the README's results.)
    burst = Burst(0, 8, 13, 0.2)
    for p in (1, 2):
        trace = track(FlowNetwork(up, down, [burst]), up, down, [burst], 30, message_bytes=1e6, p=p)
        s = summary(trace, burst)
        assert s["falls_within_rounds"] <= 3 and s["recovers_within_rounds"] <= 10, (p, s)
