"""Rendezvous, authentication, membership, failure detection, clocks and the global view."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from control_helpers import JOB, wait_event
from p2plearn.control import Client, ControlError, Coordinator, CoordinatorDead, Refused

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_rendezvous_gives_everyone_the_membership(connect):
    clients = [connect(r, ("127.0.0.1", 9000 + r)) for r in range(3)]
    for c in clients:
        members = c.wait_members(3, timeout=5)
        assert sorted(members) == [0, 1, 2]
        assert members[2].engine == ("127.0.0.1", 9002)


def test_a_start_is_not_undone_by_peers_that_finished_before_this_one_looked(connect):
    """On a busy host the slowest peer may first look at the membership after the fast ones took
    their steps and left: the job had started, so its wait is over (it once failed a loaded start)."""
    clients = [connect(r, ("127.0.0.1", 9000 + r)) for r in range(3)]
    clients[1].wait_members(3, timeout=5, receiving=True)
    for c in clients[1:]:
        c.leave()
    deadline = time.monotonic() + 5
    while len(clients[0].members) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(clients[0].members) == [0]
    assert sorted(clients[0].wait_members(3, timeout=5, receiving=True)) == [0]
    with pytest.raises(ControlError, match="still waiting"):
        clients[0].wait_members(4, timeout=0.2)  # never that many: still a timeout


def test_a_start_is_known_to_a_peer_that_missed_every_join(connect):
    """Events published before a client's subscription is live never reach it (a busy host, a slow
    start): the membership it resyncs says how many members the job once had at once (a peer once
    waited out its start-up timeout after the others had started, trained and left)."""
    clients = [connect(r, ("127.0.0.1", 9000 + r)) for r in range(3)]
    clients[1].wait_members(3, timeout=5, receiving=True)
    for c in clients[1:]:
        c.leave()
    late = clients[0]
    with late._cond:  # as if it had seen none of the joins, then noticed a gap in the epochs
        late._replica._most_members = late._replica._most_planned = 0
        late._replica._gap = True
    assert sorted(late.wait_members(3, timeout=5, receiving=True)) == [0]


def test_wrong_key_is_refused(coordinator):
    with pytest.raises(Refused, match="authentication"):
        Client(coordinator.address, JOB, "00" * 32, rank=0, connect_timeout=5)
    assert coordinator.members() == {}


def test_wrong_job_id_is_refused(coordinator, key):
    with pytest.raises(Refused, match="job id"):
        Client(coordinator.address, "another-job", key, rank=0, connect_timeout=5)


def test_rank_taken_by_another_process_is_refused(connect):
    connect(0)
    with pytest.raises(ControlError, match="already registered"):
        connect(0)


def test_min_clock_is_pushed_and_waitable(connect):
    a, b = connect(0), connect(1)
    a.report(3)
    assert not b.wait_min_clock(1, timeout=0.2)  # b has not reported: the slowest is still 0
    b.report(2)
    assert a.wait_min_clock(2, timeout=5) and b.wait_min_clock(2, timeout=5)
    assert a.min_clock == 2


def test_a_peer_admitted_alone_is_the_slowest_clock_at_once(connect):
    """The others left; this peer, taken for dead meanwhile, registers again with clock 12: the
    slowest live clock is its own at once, not the clock of members gone before it came (it waits
    on that clock and reports no round until the wait ends)."""
    a, b = connect(0), connect(1)
    a.report(5)
    b.report(8)
    assert b.wait_min_clock(5, timeout=5)
    a.leave()
    assert b.wait_min_clock(8, timeout=5)
    b.leave()
    b.report(12)  # refused (no longer a member), but this peer's clock is 12
    b.register(join=True)
    assert b.donor is None and b.start_clock == 12
    assert b.wait_min_clock(12, timeout=5), f"the slowest clock stayed {b.min_clock}"


def test_view_is_seeded_and_corrected_by_measurement(key):
    rates = {0: (1e6, 2e6), 1: (3e6, 4e6)}
    with Coordinator(JOB, key, world_size=2, rates=rates) as coord:
        with Client(coord.address, JOB, key, rank=0) as a, Client(coord.address, JOB, key, rank=1) as b:
            a.register()
            b.register(("127.0.0.1", 9001))
            view = a.fetch_view()
            assert view.uplink.tolist() == [1e6, 3e6] and view.downlink.tolist() == [2e6, 4e6]
            assert view.alive.tolist() == [False, True]  # planned as a receiver once its engine is known
            a.register(("127.0.0.1", 9000))
            assert a.fetch_view().alive.tolist() == [True, True]
            # a's flow to b probed b's downlink at 1 MB/s and delivered 0.5 MB/s: b's downlink was
            # the bottleneck. b's flow to a was too short to time (rate 0): no sample.
            a.report(1, links={1: {"paced": 1e6, "rate": 5e5, "probe": "downlink"}},
                     load={"compute_s": 0.5, "merge_s": 0.01, "backlog": 2, "in_flight_bytes": 1e6,
                           "in_flight_msgs": 1})
            b.report(1, links={0: {"paced": 1e6, "rate": 0.0}}, load={"compute_s": "nonsense", "merge_s": 0.0005})
            assert a.wait_min_clock(1, timeout=5)
            view = a.fetch_view()
            assert view.round == 1
            assert view.downlink[1] < 4e6 and view.downlink[0] == 2e6
            assert view.uplink.tolist() == [1e6, 3e6]  # a probe's limit is the probed end's; b: no sample
            assert view.uplink_target.tolist() == [1e6, 3e6] and view.downlink_age.tolist() == [2, 0]
            assert view.compute_s.tolist() == [0.5, 0.0] and view.backlog.tolist() == [2, 0]  # garbage: 0
            assert view.merge_s.tolist() == [0.01, 0.0]  # below the floor of its unit: 0
            assert view.in_flight_bytes.tolist() == [1e6, 0] and view.in_flight_msgs.tolist() == [1, 0]
            deadline = time.monotonic() + 5  # the same view is pushed once the round completes
            while (b.view is None or b.view.round < 1) and time.monotonic() < deadline:
                b.wait_min_clock(1, 0.05)
            assert b.view is not None and np.array_equal(b.view.uplink, view.uplink)


def test_without_a_topology_a_peer_is_planned_at_its_interface_rate(connect):
    from p2plearn.control.estimator import BandwidthEstimator
    from p2plearn.transport.nic import LOOPBACK_RATE

    a, b = connect(0, ("127.0.0.1", 9000)), connect(1)
    view = a.fetch_view()
    assert view.uplink[0] == view.downlink[0] == LOOPBACK_RATE  # registered from loopback
    assert view.uplink[1] == BandwidthEstimator().default_rate  # no engine address yet: nothing known


def test_leave_is_told_to_the_others(connect):
    a, b = connect(0), connect(1)
    b.leave()
    assert wait_event(a, "leave", timeout=2, rank=1) is not None
    assert 1 not in a.members


_VICTIM = """
import sys, time
from p2plearn.control import Client
c = Client(sys.argv[1], sys.argv[2], sys.argv[3], rank=2)
c.register()
c.report(1)  # past its start-up: a silent peer is now suspected within the heartbeats' rhythm
print("registered", flush=True)
time.sleep(60)
"""


def test_killed_peer_is_seen_dead_within_2s(coordinator, key, connect):
    a, b = connect(0), connect(1)
    victim = subprocess.Popen([sys.executable, "-c", _VICTIM, coordinator.address, JOB, key],
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        assert victim.stdout.readline().strip() == b"registered"
        a.wait_members(3, timeout=5)
        victim.kill()
        killed = time.monotonic()
        seen = [wait_event(c, "dead", timeout=5, rank=2) for c in (a, b)]
        elapsed = time.monotonic() - killed
    finally:
        victim.kill()
        victim.wait()
    assert all(seen)
    print(f"death seen by both after {elapsed:.2f} s")
    assert elapsed < 2.0  # phi-accrual at 8 with a 0.5 s heartbeat: ~1.4 s of silence, checked every 0.1 s
    assert 2 not in a.members and 2 not in b.members


@pytest.mark.slow
def test_a_coordinator_only_slow_keeps_its_members_connections(coordinator, connect):
    """Ticks stop for 4 s (a descheduled coordinator, or a starved client, looks the same): the
    client looks for its coordinator again, finds the same one, and keeps its connections, for a
    member whose connections all close is taken for a process that exited (declared dead at once
    unless a heartbeat comes within one interval: on a busy host it may not)."""
    a, b = connect(0), connect(1)
    a.wait_members(2, timeout=5)
    time.sleep(1.0)  # a few heartbeats: both connections of rank 1 are known as its own
    connections = {fd for fd, r in coordinator._table.connections.items() if r == 1}
    publish, until = coordinator._publish, time.monotonic() + 4.0

    def no_ticks(*publications):
        publish(*(pub for pub in publications if pub.kind != "tick" or time.monotonic() > until))

    coordinator._publish = no_ticks
    while time.monotonic() < until + 2.0:
        time.sleep(0.1)
    assert b.failovers >= 1, "the client never suspected its coordinator: the case is not tested"
    assert b.coordinator_changes == 0
    assert {fd for fd, r in coordinator._table.connections.items() if r == 1} == connections
    assert wait_event(a, "dead", timeout=1.0, rank=1) is None
    assert 1 in a.members and 1 in b.members


def test_a_dead_coordinator_is_replaced_by_the_lowest_live_rank(key):
    coord = Coordinator(JOB, key, world_size=2, heartbeat=0.2).start()
    clients = [Client(coord.address, JOB, key, rank=r, successor_wait=5.0) for r in (0, 1)]
    try:
        for c in clients:
            c.register(("127.0.0.1", 9000 + c.rank))
        for c in clients:
            c.report(3)
        assert clients[1].wait_min_clock(3, timeout=5)
        coord.stop()
        stopped = time.monotonic()
        moved = [wait_event(c, "coordinator_moved", timeout=20) for c in clients]
        elapsed = time.monotonic() - stopped
        assert all(moved) and moved[0].endpoint == moved[1].endpoint == clients[0].standby
        print(f"both clients follow rank 0's successor after {elapsed:.2f} s")
        assert elapsed < 10.0
        # The successor rebuilt the membership and the clock table from the peers' reports.
        assert sorted(clients[1].wait_members(2, timeout=5)) == [0, 1]
        assert clients[1].members[1].engine == ("127.0.0.1", 9001)
        for c in clients:
            c.report(4)
        assert clients[0].wait_min_clock(4, timeout=5) and clients[1].wait_min_clock(4, timeout=5)
        assert clients[1].view.term == 1
    finally:
        for c in clients:
            c.close()
        coord.stop()
        _stop_successor(clients[0])


def test_a_successor_knows_the_clocks_the_peers_resume_with_before_any_report(key):
    """Peers go on training while their coordinator is gone; once they follow the successor, BSP
    peers far enough ahead wait on the slowest clock and report no round meanwhile: the successor's
    clock must come from their re-registrations (it once stayed at the view's, from before the
    outage, and every peer waited out the 30 s round cap)."""
    coord = Coordinator(JOB, key, world_size=2, heartbeat=0.2).start()
    clients = [Client(coord.address, JOB, key, rank=r, successor_wait=5.0) for r in (0, 1)]
    try:
        for c in clients:
            c.register(("127.0.0.1", 9000 + c.rank))
            c.report(3)
        assert clients[1].wait_min_clock(3, timeout=5)
        coord.stop()
        for c in clients:
            c.report(40)  # rounds made during the outage: nobody hears of them
        assert all(wait_event(c, "coordinator_moved", timeout=20) for c in clients)
        assert all(c.wait_min_clock(40, timeout=5) for c in clients), [c.min_clock for c in clients]
    finally:
        for c in clients:
            c.close()
        coord.stop()
        _stop_successor(clients[0])


def _stop_successor(client):
    if client._failover.spawned is not None:
        client._failover.spawned.stop()


def test_an_observer_gives_up_when_no_coordinator_comes_back(key):
    coord = Coordinator(JOB, key, world_size=1, heartbeat=0.2).start()
    observer = Client(coord.address, JOB, key, give_up=1.5, successor_wait=0.5)
    try:
        coord.stop()
        started = time.monotonic()
        with pytest.raises(CoordinatorDead):
            observer.wait_min_clock(10, timeout=15)
        assert time.monotonic() - started < 10.0
        assert wait_event(observer, "coordinator_dead", timeout=1) is not None
        with pytest.raises(CoordinatorDead):
            observer.fetch_view()
    finally:
        observer.close()


def test_no_coordinator_is_a_timeout_error(key):
    import socket

    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ControlError, match="no coordinator answered"):
        Client(f"127.0.0.1:{port}", JOB, key, rank=0, connect_timeout=1.0, timeout=0.5)


def test_a_connect_that_reached_its_own_socket_is_not_taken_for_the_coordinator(key, monkeypatch):
    """On one host, a connect to a port where nothing listens yet can come from that very port (TCP
    simultaneous open): the client then reads its own HELLO back. Made on purpose here with ZeroMQ's
    source-port syntax; the client must see its echo for what it is and keep waiting."""
    import socket

    from p2plearn.control import client as client_module
    from p2plearn.control.requester import Requester

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    echoes = []
    request = Requester.request

    def recorded(self, *args, **kwargs):
        try:
            return request(self, *args, **kwargs)
        except client_module.SelfConnected as exc:
            echoes.append(str(exc))
            raise

    monkeypatch.setattr(Requester, "request", recorded)
    with pytest.raises(ControlError, match="no coordinator answered"):
        Client(f"tcp://127.0.0.1:{port};127.0.0.1:{port}", JOB, key, rank=0, connect_timeout=2.0, timeout=0.5)
    assert echoes and "came back from this socket itself" in echoes[0]


def test_joiner_is_given_a_donor_and_the_donor_is_told(connect):
    a, b = connect(0, ("127.0.0.1", 9000)), connect(1, ("127.0.0.1", 9001))
    a.report(4)
    b.report(5)
    assert a.wait_min_clock(4, timeout=5)
    joiner = connect(None, ("127.0.0.1", 9100), join=True)
    assert joiner.rank == 2
    assert joiner.donor.rank == 1  # the most advanced live peer
    assert joiner.start_clock == 5
    event = wait_event(b, "donate", timeout=2)
    assert event is not None and (event.rank, event.engine, event.clock) == (2, ("127.0.0.1", 9100), 5)
    assert wait_event(a, "join", timeout=2, rank=2) is not None
    assert wait_event(a, "donate", timeout=0.2) is None  # only the donor is asked


def test_a_joiner_waiting_for_its_state_holds_no_one_back(connect):
    """Until it reports a round (it holds a state by then) a joiner is not the slowest clock: its
    donor sends the state between two of its own rounds, and BSP's lead bound must not make the
    donor wait on the joiner first (the cap, 30 s, with a restarted peer in a loaded job)."""
    a, b = connect(0, ("127.0.0.1", 9000)), connect(1, ("127.0.0.1", 9001))
    a.report(4)
    b.report(4)
    assert a.wait_min_clock(4, timeout=5)
    joiner = connect(None, ("127.0.0.1", 9100), join=True)
    assert joiner.donor is not None and joiner.start_clock == 4
    a.report(9)
    b.report(9)
    assert a.wait_min_clock(9, timeout=5), f"the slowest clock stayed {a.min_clock}"
    joiner.report(5)  # it took a state from clock 4: from now on it is the slowest
    deadline = time.monotonic() + 5
    while a.min_clock != 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert a.min_clock == 5


def test_hostile_frames_neither_kill_nor_stall_the_coordinator(coordinator, connect, key):
    import zmq

    from p2plearn.control import protocol as p
    from p2plearn.keys import control_key

    member = connect(0)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(p.endpoint(coordinator.address))
    try:
        nested = b"[" * 100_000 + b"]" * 100_000
        sock.send_multipart([nested, b""])  # an outsider's, unsigned
        assert p.parse_refusal(_reply(sock)) is not None
        tag = p._tag(control_key(key), nested, [])
        sock.send_multipart([nested, tag])  # a key holder's: signed, but no JSON object
        assert p.parse_refusal(_reply(sock))["reason"].startswith("malformed body")
        for rank in (["not", "a rank"], 10**12):  # mistyped fields get an error, not a dead loop
            sock.send_multipart(p.pack(control_key(key), JOB, {"type": p.REGISTER, "id": 1, "rank": rank,
                                                               "session": "s", "host": "h", "engine": None}))
            assert p.unpack(control_key(key), JOB, _reply(sock))[0]["type"] == p.ERROR
        sock.send_multipart([b"x" * (p.MAX_REQUEST_BYTES + 1), b""])  # libzmq drops the connection
        assert not sock.poll(500)
    finally:
        sock.close()
    assert sorted(connect(1).wait_members(2, timeout=5)) == [0, 1]  # still serving: a newcomer registers
    assert coordinator.errors >= 1  # the mistyped requests were counted


def _reply(sock) -> list[bytes]:
    assert sock.poll(5000), "no reply"
    return sock.recv_multipart()
