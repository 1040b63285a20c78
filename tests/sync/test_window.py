"""The merge rule (`sync.window.MergeWindow`) on its own: no clock, no sockets."""
from __future__ import annotations

import pytest

from p2plearn.sync.window import (AHEAD_ROUNDS, GRACE_S, JOINER_WAIT_S, LATE_SENDER, MIN_WAIT_S, RECENT_ROUNDS,
                                  MergeWindow)


def test_bsp_merges_its_own_round_and_holds_only_a_peer_far_ahead():
    bsp = MergeWindow()
    assert bsp.merged(7) == (7, 7)
    assert bsp.hold_target(7) == 8 - AHEAD_ROUNDS
    assert bsp.wanted(8) == (7, 8 + AHEAD_ROUNDS)


@pytest.mark.parametrize("s", [0, 1, 3])
def test_ssp_merges_the_bounds_rounds_after_the_slowest_clock_reaches_it(s):
    ssp = MergeWindow(s, ssp=True)
    assert ssp.merged(7) == (7 - s, 7)
    assert ssp.hold_target(7) == 8 - s
    assert ssp.wanted(8) == (7 - s, 8 + s + AHEAD_ROUNDS)


def test_a_negative_staleness_is_refused():
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        MergeWindow(-1, ssp=True)


def test_a_deadline_sets_the_wait_to_a_few_deadlines_within_the_cap():
    window = MergeWindow(round_cap_s=5.0)
    assert window.wait_limit(0.5, [], joined=False, planned_s=0.1) == LATE_SENDER * 0.5 + GRACE_S
    assert window.wait_limit(10.0, [0.1] * 5, joined=False, planned_s=0.1) == 5.0


def test_before_typical_rounds_a_starter_waits_the_cap_and_a_joiner_a_few_plans():
    window = MergeWindow(round_cap_s=30.0)
    assert window.wait_limit(None, [0.1, 0.1], joined=False, planned_s=0.1) == 30.0
    assert window.wait_limit(None, [0.1, 0.1], joined=True, planned_s=0.1) == JOINER_WAIT_S
    assert window.wait_limit(None, [], joined=True, planned_s=2.0) == LATE_SENDER * 2.0 + GRACE_S


def test_typical_rounds_are_the_median_of_the_recent_ones_with_a_floor():
    window = MergeWindow(round_cap_s=30.0)
    assert window.wait_limit(None, [0.01, 0.02, 0.03], joined=False, planned_s=0.1) == MIN_WAIT_S
    old = [100.0] * 20  # rounds before the last RECENT_ROUNDS do not count
    recent = old + [1.0, 2.0, 3.0] + [2.0] * (RECENT_ROUNDS - 3)
    assert window.wait_limit(None, recent, joined=False, planned_s=0.1) == LATE_SENDER * 2.0 + GRACE_S


def test_only_a_silent_coordinator_lets_a_message_or_the_rounds_limit_end_a_hold():
    kw = {"newest_heard": 9, "now": 5.0, "until": 4.0}
    assert not MergeWindow.stands_in(9, clock_current=True, **kw)
    assert MergeWindow.stands_in(9, clock_current=False, **kw)
    assert not MergeWindow.stands_in(10, clock_current=False, newest_heard=9, now=3.0, until=4.0)
    assert MergeWindow.stands_in(10, clock_current=False, newest_heard=9, now=5.0, until=4.0)
