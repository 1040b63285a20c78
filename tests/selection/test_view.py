"""What selection sees: probes (NetworkView.probed, plan_flows) and load as start times (from_global)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from p2plearn.control import GlobalView
from p2plearn.selection import PACING_HEADROOM, NetworkView, Selmcast, flow_probes, plan_flows, plan_time
from p2plearn.selection.view import FRAMING, MAX_LOAD_S, MAX_PROBE_GAIN, PROBE_EVERY, probe_gains, uplink_copies

MB = 1e6


def global_view(n, rate=100 * MB, **load):
    """A GlobalView of n live peers at `rate` (estimates at their targets), with the given load arrays."""
    arrays = {name: np.zeros(n) for name in ("uplink_age", "downlink_age", "uplink_noise", "downlink_noise",
                                             "compute_s", "merge_s", "backlog", "in_flight_bytes", "in_flight_msgs")}
    arrays.update({k: np.asarray(v, float) for k, v in load.items()})
    ones = np.full(n, rate)
    return GlobalView(round=0, uplink=ones, downlink=ones, uplink_target=ones, downlink_target=ones,
                      alive=np.ones(n, dtype=bool), clock=np.zeros(n, dtype=np.int64), message_bytes=np.full(n, MB),
                      **arrays)


def test_probe_gains_pick_each_peer_once_in_probe_every_rounds_up_to_the_target():
    rate = np.array([10.0, 10.0, 10.0, 50.0])
    target = np.array([100.0, 20.0, 10.0, 100.0])
    gains = np.array([probe_gains(rate, target, r) for r in range(PROBE_EVERY)])
    assert (gains > 1).sum(axis=0).tolist() == [1, 1, 0, 1]  # peer 2 is at its target: never probed
    assert gains.max(axis=0).tolist() == [MAX_PROBE_GAIN, 2.0, 1.0, 2.0]


def test_a_probed_downlink_is_planned_and_paced_at_its_target():
    n = 6
    view = NetworkView(np.full(n, 100.0), np.array([100.0, 100, 100, 20, 100, 100]), np.ones(n), np.ones(n, bool),
                       uplink_target=np.full(n, 100.0), downlink_target=np.full(n, 100.0))
    rnd = next(r for r in range(PROBE_EVERY) if probe_gains(view.downlink, view.downlink_target, r)[3] > 1)
    probed = view.probed(rnd)
    assert probed.downlink[3] == pytest.approx(20 * MAX_PROBE_GAIN / PACING_HEADROOM)
    assert probed.probing_down.tolist() == [False, False, False, True, False, False]
    plan = Selmcast(seed=0).plan(probed, 1, rnd)
    src, dst, rate = plan_flows(probed, plan)
    assert rate[dst == 3].sum() == pytest.approx(20 * MAX_PROBE_GAIN)  # the probe offers the target
    assert flow_probes(probed, src, dst)[1].tolist() == (dst == 3).tolist()
    # the other flows keep the paces they would have without the probe (slowing them would stretch
    # them for the whole send)
    unprobed = plan_flows(replace(probed, probing_up=None, probing_down=None), plan)[2]
    assert (rate[dst != 3] == unprobed[dst != 3]).all() and (rate[dst == 3] >= unprobed[dst == 3]).all()
    other = next(r for r in range(PROBE_EVERY) if r != rnd and probe_gains(view.downlink, view.downlink_target, r)[3] == 1)
    assert view.probed(other).probing_down is None or not view.probed(other).probing_down.any()


def test_load_enters_as_start_times_in_seconds():
    view = NetworkView.from_global(global_view(3, compute_s=[0.5, 0.1, 0.2], merge_s=[0.01, 0, 0], backlog=[10, 0, 0],
                                               in_flight_bytes=[0, 50 * MB, 0]), MB)
    assert view.up_start.tolist() == pytest.approx([0.6, 0.1, 0.2])  # compute + backlog x merge time
    # a downlink first drains what still arrives (bytes / bytes per s), and takes nothing before
    # the first sender starts
    assert view.down_start.tolist() == pytest.approx([0.1, 0.5, 0.1])
    assert view.message_bytes.tolist() == pytest.approx([MB * FRAMING] * 3)  # wire bytes, as the rates count
    send = MB * FRAMING / (100 * MB)
    assert plan_time(view, {0: [1]}) == pytest.approx(max(0.6 + send, 0.5 + send))


def test_a_slow_computer_is_planned_as_a_straggler_with_fewer_receivers():
    n, policy = 8, Selmcast(seed=0)
    slow = NetworkView.from_global(global_view(n, compute_s=[0.01] * 7 + [0.04]), MB)
    plan, t = policy.solve(slow, 1, 0)
    send = MB * FRAMING / (100 * MB)
    assert t == pytest.approx(0.04 + send)  # T counts the straggler's compute, then its send
    # it starts late, so only p fit in its window; the others use theirs, from 0.01 s on
    others = int((t - 0.01) / send)
    assert others >= 3 and len(plan[7]) == 1 and all(len(plan[i]) == others for i in range(7))
    _, t_no_load = policy.solve(NetworkView.uniform(n, 100 * MB, MB * FRAMING), 1, 0)
    assert t_no_load == pytest.approx(send)  # bandwidth-only, it would be planned as if it were not there


def senders_of(plan, j):
    return sum(j in rs for rs in plan.values())


def test_a_slow_computer_gets_fewer_senders_when_merging_costs_time():
    n, policy = 8, Selmcast(seed=0)
    send = MB * FRAMING / (100 * MB)
    compute = [0.01] * 7 + [0.04]
    # 8 ms per merge: by T the fast peers can merge 5 messages, the slow one (30 ms later) 1
    slow = NetworkView.from_global(global_view(n, compute_s=compute, merge_s=[0.008] * n), MB)
    plan, t = policy.solve(slow, 1, 0)
    assert slow.merge_cost.tolist() == [0.008] * n  # merge_s, seconds per message
    assert t == pytest.approx(plan_time(slow, plan)) and t >= 0.04 + send
    assert senders_of(plan, 7) <= int((t - 0.04) / 0.008) == 1
    assert min(senders_of(plan, j) for j in range(7)) >= 2
    free = NetworkView.from_global(global_view(n, compute_s=compute), MB)  # merging free: as many as the others
    free_plan = policy.plan(free, 1, 0)
    assert senders_of(free_plan, 7) >= min(senders_of(free_plan, j) for j in range(7))


def test_a_receiver_still_receiving_gets_fewer_senders():
    n, policy = 8, Selmcast(seed=0)
    idle = NetworkView.from_global(global_view(n), MB)
    busy = NetworkView.from_global(global_view(n, in_flight_bytes=[0] * 7 + [3 * MB]), MB)
    assert senders_of(policy.plan(busy, 2, 0), 7) < senders_of(policy.plan(idle, 2, 0), 7)


def test_one_member_reporting_an_absurd_load_is_planned_as_late_not_refused():
    """A member's report must not make every peer's plan fail (the planner refuses > 1e6 s)."""
    n = 4
    absurd = NetworkView.from_global(global_view(n, compute_s=[0, 1e300, 0, 0], merge_s=[0, 0, 1e300, 0],
                                                 backlog=[0, 0, 5, 0], in_flight_bytes=[0, 0, 0, 1e300]), MB)
    assert absurd.up_start.max() <= MAX_LOAD_S and absurd.merge_cost.max() <= MAX_LOAD_S
    assert absurd.down_start.max() <= MAX_LOAD_S
    plan = Selmcast(seed=0).plan(absurd, 1, 0)
    assert all(len(plan[i]) >= 1 for i in range(n))  # every peer still has receivers


@pytest.mark.parametrize("bad", [-1.0, np.inf, np.nan])
def test_selmcast_rejects_bad_start_times(bad):
    view = NetworkView.uniform(3, 1.0, 1.0)
    with pytest.raises(ValueError, match="up_start"):
        Selmcast().plan(NetworkView(view.uplink, view.downlink, view.message_bytes, view.alive,
                                    up_start=np.array([0.0, bad, 0.0])), 1, 0)


def test_multicast_domains_count_one_copy_per_group_and_one_per_receiver_outside():
    """Mixed mode: peers 0-3 share a LAN (domain 0), 4-7 are unicast only; uplinks are the bottleneck."""
    n, p = 8, 3
    view = NetworkView(np.full(n, 10.0), np.full(n, 1000.0), np.ones(n), np.ones(n, dtype=bool),
                       mcast_domain=np.array([0, 0, 0, 0, -1, -1, -1, -1], dtype=np.int32))
    plan, t = Selmcast(seed=1).solve(view, p, 0)
    assert t == pytest.approx(plan_time(view, plan))
    # a unicast sender sends p copies (0.3 s); in that time a LAN sender sends its group one copy and
    # two more outside: it reaches its 3 mates and 2 others
    assert t == pytest.approx(0.3)
    for i in range(4):
        assert {1, 2, 3, 0} - {i} <= set(plan[i]) and len(plan[i]) == 5
    assert all(len(plan[i]) == 3 for i in range(4, 8))
    unicast = Selmcast(seed=1).solve(replace(view, mcast_domain=None), p, 0)[0]
    assert all(len(rs) == 3 for rs in unicast.values())
    # everyone in one domain is IP multicast
    one = replace(view, mcast_domain=np.zeros(n, dtype=np.int32))
    assert Selmcast(seed=1).solve(one, p, 0)[1] == pytest.approx(Selmcast(seed=1, ip_multicast=True).solve(view, p, 0)[1])


def test_a_group_is_paced_at_its_slowest_receiver():
    view = NetworkView(np.full(4, 100.0), np.array([100.0, 100, 20, 100]), np.ones(4), np.ones(4, dtype=bool),
                       mcast_domain=np.array([0, 0, 0, -1], dtype=np.int32))
    src, dst, rate = plan_flows(view, {0: [1, 2, 3]})
    # one group copy (to 1 and 2) at the slower member's 20, one unicast copy (to 3) at half the uplink
    assert dict(zip(dst.tolist(), (rate / PACING_HEADROOM).tolist())) == pytest.approx({1: 20.0, 2: 20.0, 3: 50.0})
    assert uplink_copies(4, src, dst < 3).tolist() == [2, 0, 0, 0]
    assert plan_time(view, {0: [1, 2, 3]}) == pytest.approx(1 / 20)  # receiver 2's downlink
    assert plan_time(view, {0: [1, 3]}) == pytest.approx(2 / 100)    # the uplink's two copies


@pytest.mark.parametrize("domain, match", [([0, -2, 0], "mcast_domain"), ([0, 0], "one entry per peer")])
def test_selmcast_rejects_bad_multicast_domains(domain, match):
    with pytest.raises(ValueError, match=match):
        Selmcast().plan(replace(NetworkView.uniform(3, 1.0, 1.0), mcast_domain=np.array(domain, dtype=np.int32)), 1, 0)
