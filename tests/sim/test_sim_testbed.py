"""The simulator's round time within 15% of the testbed's (root: builds network namespaces).

Not here, because they miss (experiments/results/sim_validation.md): selmcast on heterogeneous-8
(-21%) and on incast-8 (-50%), where many paced flows meet shallow queues or a 12.5 Mbit/s uplink.
incast-8 random is within 4% on a quiet host but -21% with a training job beside it: its 1 Gbit/s
links make it depend on the host's load, too flaky for a test on shared CI machines.
"""
import pytest

from p2plearn.sim.validate import TOPOLOGY_DIR, compare


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("topology, policy, p, size", [("homogeneous-8", "random", 2, 2_000_000),
                                                        ("homogeneous-8", "selmcast", 2, 2_000_000),
                                                        ("heterogeneous-8", "random", 1, 1_000_000)])
def test_simulated_round_time_within_15_percent(topology, policy, p, size):
    result = compare(TOPOLOGY_DIR / f"{topology}.json", policy, p, size, rounds=3)
    assert abs(result.error) <= 0.15, result
