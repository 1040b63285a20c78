"""RoundPlanner under each transport mode: which receivers a sender's group serves, its pacing
rates (a group copy vs unicast copies on its uplink) and the plan's T, from the view's multicast domains."""
from __future__ import annotations

import numpy as np
import pytest

from p2plearn.control import GlobalView
from p2plearn.selection import PACING_HEADROOM
from p2plearn.selection.view import FRAMING
from p2plearn.sync.planner import RoundPlanner, multicast_groups

R, M = 1e6, 1e4  # bytes/s, bytes


def view(up, down, domain):
    n = len(up)
    zeros = {name: np.zeros(n) for name in ("uplink_age", "downlink_age", "uplink_noise", "downlink_noise",
                                            "compute_s", "merge_s", "backlog", "in_flight_bytes", "in_flight_msgs")}
    up, down = np.asarray(up, float), np.asarray(down, float)
    return GlobalView(round=0, uplink=up, downlink=down, uplink_target=up, downlink_target=down,
                      alive=np.ones(n, dtype=bool), clock=np.zeros(n, dtype=np.int64), message_bytes=np.full(n, M),
                      mcast_domain=np.asarray(domain, dtype=np.int64), **zeros)


def test_a_group_serves_the_receivers_in_the_senders_domain_when_there_are_two_or_more():
    plan = {0: [1, 2, 3], 1: [0], 2: [0, 3], 3: [0, 1, 2]}
    assert multicast_groups(np.array([0, 0, 0, -1]), plan) == {0: [1, 2], 1: [], 2: [], 3: []}
    assert multicast_groups(np.array([0, 0, 2, 2]), plan) == {0: [], 1: [], 2: [], 3: []}  # 2->3: one is no group
    assert multicast_groups(None, plan) == {i: [] for i in plan}


# All to all among 4 peers, downlinks 10x the uplinks (uplinks are the bottleneck); rank 3 multicast
# does not reach (domain -1), its uplink 3x the others'.
UP, DOWN, DOMAIN = [R, R, R, 3 * R], [10 * R] * 4, [0, 0, 0, -1]


@pytest.mark.parametrize("mode,grouped,rates,copies_of_0", [
    ("unicast", [set()] * 4, [R / 3, R / 3, R / 3, R], 3),
    ("auto", [{1, 2}, {0, 2}, {0, 1}, set()], [R / 2, R / 2, R / 2, R], 2),  # a group copy + one to rank 3
    ("multicast", [{1, 2, 3}, {0, 2, 3}, {0, 1, 3}, {0, 1, 2}], [R, R, R, 3 * R], 1),
])
def test_each_sender_paces_its_flows_at_its_uplink_over_its_copies(mode, grouped, rates, copies_of_0):
    planner = RoundPlanner("all", 3, 0, mode)
    g = view(UP, DOWN, DOMAIN)
    for rank in range(4):
        plan = planner.plan(g, 0, rank, M)
        assert plan.grouped == grouped[rank]
        assert [rate for _, rate in plan.receivers] == pytest.approx([PACING_HEADROOM * rates[rank]] * 3)
    # T: the slowest uplink's copies (the downlinks take 3 messages at 10x the rate)
    assert plan.planned_time == pytest.approx(max(copies_of_0 * M * FRAMING / R, 3 * M * FRAMING / (3 * R)))
