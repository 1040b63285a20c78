"""Multicast domains: the peers' probe reports (Client.report_reach) turned into the view's mcast_domain."""

import time

import pytest

from control_helpers import JOB
from p2plearn.control import Client, ControlError, Coordinator
from p2plearn.control import protocol as p
from p2plearn.control.fields import read_resume
from p2plearn.control.table import MembershipTable
from p2plearn.control.view import UNICAST_ONLY, domains_from_reach, reach_of

ALL_OF_4 = {i: {j for j in range(4) if j != i} for i in range(4)}


@pytest.mark.parametrize("reach,size,expected", [
    (ALL_OF_4, 4, [0, 0, 0, 0]),                                               # one LAN
    ({0: {1, 2}, 1: {0, 2}, 2: {0, 1}, 3: {4}, 4: {3}}, 5, [0, 0, 0, 3, 3]),  # two LANs
    ({0: {1, 2}, 1: {2}, 2: {0, 1}}, 4, [0, -1, 0, -1]),                       # 1 -> 0 one way only; 3 never reported
    ({0: {1}, 1: {0, 2}, 2: {1}}, 3, [0, 0, -1]),                              # 0-1, 1-2 but not 0-2: 2 by unicast
    ({0: {1, 7, -1}, 1: {0}, 7: {0}, -1: {0}}, 2, [0, 0]),                     # ranks beyond the view are left out
    ({0: set(), 1: set()}, 2, [-1, -1]),                                       # probes that reached nobody
])
def test_a_domain_is_a_set_of_peers_that_reach_each_other_both_ways(reach, size, expected):
    domain = domains_from_reach(reach, size)
    assert domain.tolist() == expected
    assert domains_from_reach(reach_of(domain), size).tolist() == expected  # what a successor takes over


def _domains(client, expected, timeout=5.0):
    """The first view pushed to ``client`` whose mcast_domain is ``expected`` (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = client.view
        if view is not None and view.mcast_domain.tolist() == expected:
            return view
        time.sleep(0.02)
    raise AssertionError(f"view's mcast_domain {client.view.mcast_domain.tolist()}, expected {expected}")


def test_reach_reports_make_the_views_domains_and_a_peer_gone_leaves_them(connect):
    clients = [connect(r, ("127.0.0.1", 9000 + r)) for r in range(3)]
    clients[0].wait_members(3, timeout=5)
    assert clients[0].view.mcast_domain.tolist() == [UNICAST_ONLY] * 3  # nobody probed yet
    clients[0].report_reach([1, 2])
    clients[1].report_reach([0, 2])
    _domains(clients[0], [0, 0, UNICAST_ONLY])  # 2 reached by both, but has not said whom it reached
    clients[2].report_reach([0, 1])
    first = _domains(clients[1], [0, 0, 0])
    clients[0].leave()
    later = _domains(clients[1], [UNICAST_ONLY, 1, 1])
    assert later.version > first.version  # a planning input: a new version of the view


def test_a_peer_that_moves_its_engine_is_unicast_only_until_probed_again(connect):
    clients = [connect(r, ("127.0.0.1", 9000 + r)) for r in range(3)]
    clients[0].wait_members(3, timeout=5)
    for r, c in enumerate(clients):
        c.report_reach([j for j in range(3) if j != r])
    _domains(clients[0], [0, 0, 0])
    clients[2].register(("127.0.0.1", 9102))  # a new engine: the others' probes reached the old one
    _domains(clients[0], [0, 0, UNICAST_ONLY])


def test_a_malformed_reach_report_is_refused_counted_and_harmless(coordinator, connect):
    clients = [connect(r, ("127.0.0.1", 9000 + r)) for r in range(2)]
    clients[0].wait_members(2, timeout=5)
    before = coordinator.errors
    with pytest.raises(ControlError, match=r"reached ranks \[3\] are out of range \(the job has ranks 0\.\.2\)"):
        clients[0].report_reach([1, 3])
    for reached in ("everyone", [1, "2"], [True], None):
        with pytest.raises(ControlError, match="reached must be a list of ranks"):
            clients[0]._requester.request({"type": p.REACH, "rank": 0, "reached": reached})
    with pytest.raises(ControlError, match=r"rank must be an integer in \[0, "):
        clients[0]._requester.request({"type": p.REACH, "rank": -1, "reached": []})
    assert coordinator.errors == before + 6
    clients[0].report_reach([1])  # still serving, and the refused reports changed nothing
    clients[1].report_reach([0])
    assert _domains(clients[0], [0, 0, UNICAST_ONLY]).alive.tolist() == [True, True, False]


def test_domains_survive_a_coordinator_failover_through_the_view_handed_over(key):
    old = Coordinator(JOB, key, world_size=2, heartbeat=0.1).start()
    clients = []
    try:
        clients = [Client(old.address, JOB, key, rank=r, connect_timeout=5.0) for r in range(2)]
        for r, c in enumerate(clients):
            c.register(("127.0.0.1", 9000 + r))
        for r, c in enumerate(clients):
            c.report_reach([1 - r])
        view = _domains(clients[0], [0, 0])
        new = MembershipTable(2, heartbeat_interval=0.1, term=1)  # the successor's state
        header, blobs = view.to_blobs()
        new.adopt(read_resume({"view": header, "members": [m.to_dict() for m in clients[0].members.values()],
                               "epoch": 1}, blobs))
        assert new.view().mcast_domain.tolist() == [0, 0]
    finally:
        for c in clients:
            c.close()
        old.stop()


def test_domains_reported_at_start_up_apply_from_a_round_no_peer_can_have_planned(connect):
    """A peer starts its rounds as soon as it has reported its reach, while others still probe."""
    clients = [connect(r, ("127.0.0.1", 9000 + r)) for r in range(2)]
    assert clients[0].wait_members(2, timeout=5) and clients[0].view.from_round == 0  # membership before round 0
    clients[0].report_reach([1])
    clients[1].report_reach([0])
    view = _domains(clients[0], [0, 0, UNICAST_ONLY])  # the fixture's job has 3 ranks
    assert view.from_round == 2 and clients[0].view_for(0).mcast_domain.tolist() == [UNICAST_ONLY] * 3
