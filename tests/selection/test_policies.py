"""Invariants every policy keeps, the registry, SELMCAST against random on heterogeneous views, bad input."""
from __future__ import annotations

import numpy as np
import pytest

from p2plearn.selection import POLICIES, NetworkView, Selmcast, average_fanout, make_policy, plan_time
from p2plearn.compute import InvalidArgument
from tests.selection.conftest import random_view

RANDOMISED = ["selmcast", "random", "exponential"]   # the others have no ties to break


def _views():
    rng = np.random.default_rng(3)
    yield NetworkView.uniform(9, 1e6, 1e5)
    yield random_view(rng, 12, equal=True, dead=0.3)
    yield random_view(rng, 10, equal=False, receiver_tight=True)
    yield random_view(rng, 3, equal=True, dead=0.0)


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("p", [0, 1, 3, 20])
def test_invariants(name, p):
    for view in _views():
        live = set(np.flatnonzero(view.alive).tolist())
        plan = make_policy(name, seed=5).plan(view, p, 3)
        assert set(plan) == live
        for i, rs in plan.items():
            assert i not in rs and set(rs) <= live and len(set(rs)) == len(rs)
            assert len(rs) >= min(p, len(live) - 1)
        assert make_policy(name, seed=5).plan(view, p, 3) == plan


@pytest.mark.parametrize("name", RANDOMISED)
def test_rounds_break_ties_differently(name):
    view = NetworkView.uniform(16, 1e6, 1e5)
    policy = make_policy(name, seed=1)
    assert len({str(policy.plan(view, 2, r)) for r in range(4)}) > 1


def test_dead_peers_and_tiny_views():
    view = NetworkView.uniform(4, 1e6, 1e5)
    alone = NetworkView(view.uplink, view.downlink, view.message_bytes, np.array([False, True, False, False]))
    nobody = NetworkView(view.uplink, view.downlink, view.message_bytes, np.zeros(4, dtype=bool))
    for name in POLICIES:
        assert make_policy(name).plan(alone, 2, 0) == {1: []}
        assert make_policy(name).plan(nobody, 2, 0) == {}


def test_fixed_patterns():
    view = NetworkView.uniform(8, 1e6, 1e5)
    assert make_policy("ring").plan(view, 2, 0)[7] == [0, 1]
    assert make_policy("exponential").plan(view, 2, 0)[0] == [1, 2]
    assert make_policy("exponential").plan(view, 2, 2)[0] == [4, 1]   # exponents rotate: 2^2, 2^0
    assert make_policy("all").plan(view, 1, 0)[3] == [0, 1, 2, 4, 5, 6, 7]


def test_selmcast_beats_random_on_heterogeneous_views():
    # Downlinks are the bottleneck here; where one slow uplink bounds T, every policy ties at that bound.
    rng = np.random.default_rng(11)
    for n, p, equal in [(16, 2, True), (64, 4, True), (64, 3, False), (200, 4, True)]:
        view = random_view(rng, n, equal=equal, receiver_tight=True, dead=0.05)
        plan, t = Selmcast(seed=0).solve(view, p, 0)
        random_t = np.mean([plan_time(view, make_policy("random", seed=s).plan(view, p, 0)) for s in range(5)])
        assert t < random_t
        assert average_fanout(plan) >= p


def test_selmcast_options():
    rng = np.random.default_rng(4)
    view = random_view(rng, 30, equal=True, dead=0.0)
    capped, t_capped = Selmcast(max_fanout=4).solve(view, 3, 0)
    plan, t = Selmcast().solve(view, 3, 0)
    assert max(map(len, capped.values())) <= 4 < max(map(len, plan.values()))
    assert t_capped <= t
    ip_plan, ip_t = Selmcast(ip_multicast=True).solve(view, 3, 0)
    assert ip_t == pytest.approx(plan_time(view, ip_plan, ip_multicast=True)) and ip_t <= t


def test_make_policy_names():
    assert {"selmcast", "random", "all", "ring", "exponential"} == set(POLICIES)
    assert make_policy("selmcast", seed=3, ip_multicast=True).ip_multicast
    with pytest.raises(ValueError, match="unknown selection policy"):
        make_policy("nope")


def _view(**change) -> NetworkView:
    fields = dict(uplink=np.full(4, 1e6), downlink=np.full(4, 1e6), message_bytes=np.full(4, 1e5),
                  alive=np.ones(4, dtype=bool))
    fields.update(change)
    return NetworkView(**fields)


@pytest.mark.parametrize("view, p, kw, match", [
    (_view(uplink=np.array([1e6, -1, 1e6, 1e6])), 2, {}, r"uplink\[1\] = -1"),
    (_view(downlink=np.array([1e6, 1e6, np.nan, 1e6])), 2, {}, r"downlink\[2\] = nan"),
    (_view(message_bytes=np.array([1e5, 1e5, 1e5, np.inf])), 2, {}, r"message_bytes\[3\] = inf"),
    (_view(uplink=np.array([0.0, 1e6, 1e6, 1e6])), 2, {}, r"uplink\[0\] = 0 for a live peer"),
    (_view(), -1, {}, "p must be >= 0"),
    (_view(), 3, {"max_fanout": 0}, "max_fanout"),
    (_view(), 3, {"max_fanin": 0}, "max_fanin"),
    (NetworkView(*(np.zeros(0),) * 3, np.zeros(0, dtype=bool)), 1, {}, "n must be > 0"),
    (_view(alive=np.ones(3, dtype=bool)), 1, {}, "one entry per peer"),
    (_view(up_start=np.array([1e300, 0, 0, 0])), 1, {}, r"up_start\[0\] = 1e\+300: must be in \[0, 1e\+06\] seconds"),
    (_view(down_start=np.array([0, 0, 0, 2e6])), 1, {}, r"down_start\[3\] = 2e\+06"),
    (_view(merge_cost=np.array([0, 1e7, 0, 0])), 1, {}, r"merge_cost\[1\] = 1e\+07"),
])
def test_selmcast_rejects_bad_input(view, p, kw, match):
    with pytest.raises(ValueError, match=match):
        Selmcast(**kw).plan(view, p, 0)


@pytest.mark.parametrize("domain, match", [
    ([0, 0, 2**40, 1], r"mcast_domain\[2\] = 1099511627776"),   # an int32 cast made it 0: one domain with 0 and 1
    ([0.5, 0, 1, 1], r"mcast_domain\[0\] = 0.5"),
    ([0, np.nan, 1, 1], r"mcast_domain\[1\] = nan"),
    ([0, 0, -2, 1], r"mcast_domain\[2\] = -2"),
])
def test_multicast_domains_that_a_cast_would_change_are_refused(domain, match):
    with pytest.raises(ValueError, match=match):
        _view(mcast_domain=np.array(domain))


def test_multicast_domains_as_whole_floats_or_wide_ints_are_taken_as_they_are():
    for domain in (np.array([1.0, 0.0, -1.0, 1.0]), np.array([2**31 - 1, 0, -1, 2**31 - 1], dtype=np.int64)):
        view = _view(mcast_domain=domain)
        assert view.mcast_domain.tolist() == domain.astype(int).tolist()
        assert all(len(r) >= 1 for r in Selmcast().plan(view, 1, 0).values())


def test_a_transfer_shorter_than_a_start_times_last_digit_still_gets_a_plan():
    # 1 byte at 1 TB/s (1e-12 s) after 1e6 s: start + transfer rounds to start, which left no
    # upper bound on T with any room on that uplink
    view = _view(uplink=np.full(4, 1e12), message_bytes=np.ones(4), up_start=np.array([1e6, 0, 0, 0]))
    plan, t = Selmcast().solve(view, 1, 0)
    assert t >= 1e6 and t == pytest.approx(plan_time(view, plan), rel=1e-12)


def test_one_slow_peer_among_fast_ones_does_not_make_the_plan_all_to_all():
    n = 1500
    view = NetworkView(np.full(n, 1e9), np.full(n, 1e9), np.full(n, 1e6), np.ones(n, dtype=bool))
    view.uplink[0] = 1e5  # its p copies take 10,000x longer than anyone's: T leaves everyone else idle
    plan, _ = Selmcast().solve(view, 2, 0)
    assert max(map(len, plan.values())) == 64 and min(map(len, plan.values())) >= 2
    uncapped, _ = Selmcast(max_fanout=None).solve(view, 2, 0)
    assert max(map(len, uncapped.values())) == n - 1
    asked_more, _ = Selmcast(max_fanout=4).solve(view, 8, 0)  # p above the cap: p it is
    assert min(map(len, asked_more.values())) == 8 == max(map(len, asked_more.values()))


def test_fan_in_is_capped():
    n = 200
    view = NetworkView(np.full(n, 1e9), np.full(n, 1e6), np.full(n, 1e6), np.ones(n, dtype=bool))
    view.downlink[0] = 1e9  # one fast downlink among slow ones: everybody would send to it
    def most_senders(plan):
        return np.bincount([j for rs in plan.values() for j in rs], minlength=n).max()
    uncapped, t_uncapped = Selmcast(max_fanin=None).solve(view, 1, 0)
    assert most_senders(uncapped) == n - 1
    capped, t = Selmcast().solve(view, 1, 0)
    assert most_senders(capped) == 64 and t == pytest.approx(t_uncapped)
    assert min(map(len, capped.values())) >= 1
    asked_more, _ = Selmcast(max_fanin=2).solve(view, 8, 0)  # p above the cap: p it is
    assert most_senders(asked_more) <= 8


def test_dead_peers_rates_are_ignored_unless_invalid():
    view = _view(uplink=np.array([0.0, 1e6, 1e6, 1e6]), alive=np.array([False, True, True, True]))
    assert set(Selmcast().plan(view, 1, 0)) == {1, 2, 3}
    with pytest.raises(InvalidArgument):
        Selmcast().plan(_view(uplink=np.array([np.nan, 1e6, 1e6, 1e6]), alive=view.alive), 1, 0)


@pytest.mark.parametrize("name", ["random", "all", "ring", "exponential"])
def test_blind_policies_reject_negative_p(name):
    with pytest.raises(ValueError, match="p must be >= 0"):
        make_policy(name).plan(_view(), -1, 0)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("uplink, downlink, message", [
    (1e300, 1e6, 1e-20),    # a tiny message on a huge uplink: the lower bound underflows to 0
    (1e6, 1e300, 1e-300),
    (1e-300, 1e-300, 1e300),  # a round longer than a double can hold: refused, not inf
    (1.0, 1e6, 5e-324),
])
def test_selmcast_never_hangs_or_returns_inf_on_extreme_valid_input(uplink, downlink, message):
    view = _view(uplink=np.array([uplink, 1e6, 1e6, 1e6]), downlink=np.array([1e6, downlink, 1e6, 1e6]),
                 message_bytes=np.array([message, 1e5, 1e5, 1e5]))
    try:
        plan, t = Selmcast().solve(view, 2, 0)
    except ValueError as exc:
        assert "out of range" in str(exc)
        return
    assert np.isfinite(t) and t > 0
    assert all(len(r) >= 2 for r in plan.values())


def test_mixing_slack_gives_every_peer_a_sender_for_a_bounded_increase_of_t():
    from p2plearn.bench.selection import random_view as bench_view  # loaded downlinks: some take no message by T

    view = bench_view(256, 1e6, seed=0, loaded=True)
    for rnd in range(3):
        plan, t = Selmcast(seed=0).solve(view, 4, rnd)
        plan_slack, t_slack = Selmcast(seed=0, mixing_slack=0.5).solve(view, 4, rnd)
        fed = {j for receivers in plan.values() for j in receivers}
        fed_slack = {j for receivers in plan_slack.values() for j in receivers}
        assert len(fed) < view.n, "the view no longer starves anyone: the test shows nothing"
        assert len(fed_slack) > len(fed) and t <= t_slack <= t * 1.5 * (1 + 1e-9)
    with pytest.raises(ValueError, match="mixing_slack"):
        Selmcast(mixing_slack=-0.1).plan(view, 4, 0)


def test_paced_flows_finish_by_the_plans_t_also_with_unequal_sizes():
    from p2plearn.selection import PACING_HEADROOM, plan_flows

    rng = np.random.default_rng(11)
    late = 0.0
    for k in range(60):
        view = random_view(rng, int(rng.integers(3, 30)), equal=False, receiver_tight=k % 2 == 0)
        plan, t = Selmcast(seed=k).solve(view, int(rng.integers(1, 4)), k)
        src, dst, rate = plan_flows(view, plan)
        late = max(late, float(np.max(view.message_bytes[src] / rate)) * PACING_HEADROOM / t)
    assert late <= 1 + 1e-9, late  # an equal split of each downlink finished up to 3.6x after T
