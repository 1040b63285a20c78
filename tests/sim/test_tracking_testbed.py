"""The view follows a burst on the root testbed: real engines, tbf-shaped links changed between
rounds (p2plearn.sim.tracking_testbed). A busy host can only lower what the engines measure, so
the test checks the burst peer's estimate, which the burst itself moves: it falls within 3 rounds
and is back within 10% of its rate within 10 rounds after the burst.
`python -m p2plearn.sim.tracking --testbed` writes every estimate's error (view_tracking.csv)."""
import numpy as np
import pytest

from p2plearn.sim.tracking import BURST, MBIT, MESSAGE_BYTES, PEERS, ROUNDS, scenario, summary, track


@pytest.mark.root
@pytest.mark.slow
def test_on_the_testbed_the_burst_peers_estimate_falls_within_3_rounds_and_is_back_within_10():
    from p2plearn.sim.tracking_testbed import TestbedNetwork

    up, down, bursts = scenario()
    with TestbedNetwork(PEERS, MBIT, bursts, ROUNDS, MESSAGE_BYTES) as network:
        trace = track(network, up, down, bursts, ROUNDS, message_bytes=MESSAGE_BYTES)
    assert summary(trace, BURST)["falls_within_rounds"] <= 3
    est = np.array(trace.est_down)[:, BURST.peer]
    back = [r for r in range(BURST.end, BURST.end + 10) if (np.abs(est[r:] / down[BURST.peer] - 1) <= 0.1).all()]
    assert back, est.tolist()
