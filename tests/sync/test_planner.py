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


def test_a_sender_paces_its_flows_for_this_rounds_message_not_the_last_one_the_view_knows():
    # Downlinks are the bottleneck; rank 0's last message was a header (a filter deferred every
    # layer), this round's is as large as the others': it takes an equal share of each downlink.
    g = view([10 * R] * 4, [R] * 4, [-1] * 4)
    g = GlobalView(**{**g.__dict__, "message_bytes": np.array([100.0, M, M, M])})
    planner = RoundPlanner("all", 3, 0, "unicast")
    grown = planner.plan(g, 0, 0, M)
    assert [rate for _, rate in grown.receivers] == pytest.approx([PACING_HEADROOM * R / 3] * 3)
    assert grown.planned_time == pytest.approx(3 * M * FRAMING / R)
    # The others pace for the sizes they know (their own and rank 0's last), from the same plan.
    other = planner.plan(g, 0, 1, M)
    assert dict(other.receivers)[2] == pytest.approx(PACING_HEADROOM * R * M / (2 * M + 100))  # 0, 1, 3 send to 2
    assert (grown.senders, other.senders) == ([1, 2, 3], [0, 2, 3])
    # Twice the others' size: still an equal share (the others may have grown too), T with its size.
    doubled = planner.plan(g, 0, 0, 2 * M)
    assert [rate for _, rate in doubled.receivers] == pytest.approx([PACING_HEADROOM * R / 3] * 3)
    assert doubled.planned_time == pytest.approx(4 * M * FRAMING / R)
    # Smaller than the view's: the view's pace and T (it ends early).
    g2 = GlobalView(**{**g.__dict__, "message_bytes": np.full(4, M)})
    assert planner.plan(g2, 1, 0, M / 2) == planner.plan(g2, 1, 0, M)
    # Paced as its last message (the view's plan), rank 0's would have gone at 1/67 of that share.
    assert planner.whole_plan(g, 0, M)[0][0][0][1] == pytest.approx(PACING_HEADROOM * R * 100 / (2 * M + 100))


def test_the_simulators_whole_plan_paces_every_sender_as_its_own_plan_does():
    # Rank 0 grew from a header, rank 3 doubled, rank 1 kept its size, rank 2 shrank.
    g = view([10 * R] * 4, [R] * 4, [-1] * 4)
    g = GlobalView(**{**g.__dict__, "message_bytes": np.array([100.0, M, 3 * M, M])})
    sizes = np.array([M, M, 2 * M, 2 * M])
    planner = RoundPlanner("all", 3, 0, "unicast")
    flows, _, planned_time, _ = planner.whole_plan(g, 0, M, sizes)
    for rank in range(4):
        assert [(j, rate) for j, rate, _ in flows[rank]] == planner.plan(g, 0, rank, sizes[rank]).receivers
    # T with the grown sizes and the shrunk one's view size: receiver 0 takes M + 3M + 2M.
    assert planned_time == pytest.approx(6 * M * FRAMING / R)
