"""Virtual time to target against the testbed's stored runs (`sim.validate_train`): two-sided.

Each case replays a stored real run (seed 0) on the real compute clock, and fails when the simulator
is too optimistic as well as too pessimistic (more than TOLERANCE either way). Every case is simulated
co-located (`--colocate 2`: the real peers were processes sharing this machine's 2 cores), with the
engine's, a round's and the pacing's costs of the host the real runs ran on (HOST_COSTS, measured
there when it was quiet), not this machine's calibration now: so the check does not move with how
busy it is."""
from __future__ import annotations

import pytest

import p2plearn.sim.train as sim_train
from p2plearn.sim.validate_train import CASES, TOLERANCE, compare

# sim.calibrate's engine_cost (s per byte), round_cost (s per peer and round) and pacing_cost (s per
# second of a send, and of a flow received) on the testbed's host, quiet (load 0.6), where the stored
# runs were measured: the medians of 3, 8 and 8 calibrations at 5787e02.
HOST_COSTS = (7.9e-10, 2.9e-3, (0.033, 0.0114))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", CASES, ids=[case["topology"] for case in CASES])
def test_virtual_time_to_target_is_within_15_percent_of_the_stored_real_run(case, monkeypatch):
    monkeypatch.setattr(sim_train, "engine_cost", lambda: HOST_COSTS[0])
    monkeypatch.setattr(sim_train, "round_cost", lambda: HOST_COSTS[1])
    monkeypatch.setattr(sim_train, "pacing_cost", lambda: HOST_COSTS[2])
    replay = compare(case, seed=0)
    assert abs(replay.error) <= TOLERANCE, (
        f"{replay.topology}: virtual {replay.virtual_s:.2f} s against real {replay.real_s:.2f} s to "
        f"{replay.target:.0%}: {replay.error:+.1%}, beyond ±{TOLERANCE:.0%}")
