"""Virtual time to target against the testbed's stored runs (`sim.validate_train`): two-sided.

Each case replays a stored real run (seed 0) on the real compute clock, so it does not depend on how
busy this machine is now, and fails when the simulator is too optimistic as well as too pessimistic
(more than TOLERANCE either way). The 16-peer case is simulated co-located (`--colocate 2`: 16
processes shared the testbed's 2 cores)."""
from __future__ import annotations

import pytest

from p2plearn.sim.validate_train import CASES, TOLERANCE, compare


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", CASES, ids=[case["topology"] for case in CASES])
def test_virtual_time_to_target_is_within_15_percent_of_the_stored_real_run(case):
    replay = compare(case, seed=0)
    assert abs(replay.error) <= TOLERANCE, (
        f"{replay.topology}: virtual {replay.virtual_s:.2f} s against real {replay.real_s:.2f} s to "
        f"{replay.target:.0%}: {replay.error:+.1%}, beyond ±{TOLERANCE:.0%}")
