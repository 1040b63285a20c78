"""Unequal message sizes paced by plan_flows complete near the plan's T on the root testbed
(p2plearn.sim.unequal). A busy host only slows rounds, so the test takes the best of a few rounds
against T, and compares the two pacings round by round (both slowed alike)."""
import pytest

from p2plearn.sim.unequal import CASES, P, SIZES, measure


@pytest.mark.root
@pytest.mark.slow
def test_unequal_sizes_complete_within_1_15_of_t_and_sooner_than_an_equal_split():
    rounds = measure(CASES["homogeneous 20 Mbit/s"], SIZES, P, rounds=5)
    assert min(r.proportional_s / r.planned_s for r in rounds) <= 1.15, rounds
    assert all(r.proportional_s < r.equal_s for r in rounds), rounds
