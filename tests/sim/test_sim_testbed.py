"""The simulator's round time within 15% of the testbed's (root: builds network namespaces)."""
import pytest

from p2plearn.sim.validate import TOPOLOGY_DIR, compare


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("topology, policy, p, size", [("homogeneous-8", "random", 2, 2_000_000),
                                                        ("heterogeneous-8", "random", 1, 1_000_000)])
def test_simulated_round_time_within_15_percent(topology, policy, p, size):
    result = compare(TOPOLOGY_DIR / f"{topology}.json", policy, p, size, rounds=3)
    assert abs(result.error) <= 0.15, result
