"""The simulator's round time within 15% of the testbed's (root: builds network namespaces).

Every case of `p2plearn.sim.validate.CASES` but incast-8's: those run 8 peers at 1 Gbit/s, near
what the 2-core host moves in all, so their round time follows the host's load (a training job
beside them slowed the measured rounds by a fifth); too flaky for a test on shared CI machines.
`python -m p2plearn.sim.validate` measures them too (experiments/results/sim_validation.md).
"""
import pytest

from p2plearn.sim.validate import CASES, TOPOLOGY_DIR, compare

HOST_BOUND = "incast-8"


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("topology, policy, p, size", [c for c in CASES if c[0] != HOST_BOUND])
def test_simulated_round_time_within_15_percent(topology, policy, p, size):
    result = compare(TOPOLOGY_DIR / f"{topology}.json", policy, p, size, rounds=3)
    assert abs(result.error) <= 0.15, result
