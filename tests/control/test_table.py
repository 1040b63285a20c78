"""The membership table's rules, without sockets: what each request changes, replies and publishes."""

import time

import pytest

from p2plearn.control import protocol as p
from p2plearn.control.fields import Resume
from p2plearn.control.membership import Member
from p2plearn.control.job_view import VIEW_LEAD
from p2plearn.control.table import RANK_HEADROOM, MembershipTable


def register(table, rank, session=None, *, join=False, clock=0, resume=None, engine="auto", standby=None):
    """``table.register`` with a peer's usual fields (session ``s<rank>``): (reply, publications)."""
    session = session if session is not None else f"s{rank}"
    engine = ("127.0.0.1", 9000 + (rank or 0)) if engine == "auto" else engine
    return table.register(rank, session, join=join, host="h", engine=engine, standby=standby, clock=clock,
                          resume=resume, link_rate=None)


def kinds(publications):
    return [(pub.kind, pub.body.get("event")) for pub in publications]


def report(table, rank, clock, **kwargs):
    fields = {"loss": None, "step_time": None, "message_bytes": None, "links": {}, "load": {}, **kwargs}
    return table.report(rank, f"s{rank}", clock=clock, **fields)


def test_a_registration_is_published_as_a_join_then_a_view_and_answered_with_the_membership():
    table = MembershipTable(2)
    reply, published = register(table, 0)
    assert kinds(published) == [(p.MEMBER, "join"), (p.VIEW, None)]
    assert published[0].body["member"]["rank"] == 0 and published[0].body["epoch"] == 1
    assert reply["type"] == p.OK and reply["rank"] == 0 and reply["clock"] == 0 and reply["donor"] is None
    assert [m["rank"] for m in reply["members"]] == [0] and reply["most_members"] == 1
    assert table.registrations == 1 and table.registered() == 1 and list(table.members()) == [0]


@pytest.mark.parametrize("rank,session,join,reason", [
    (None, "s", False, "needs a rank"),
    (2 + RANK_HEADROOM, "s", False, "far beyond"),
    (0, "another", False, "already registered by another process"),
])
def test_refused_registrations_change_nothing(rank, session, join, reason):
    table = MembershipTable(2)
    register(table, 0)
    before = table.snapshot()
    reply, published = register(table, rank, session, join=join)
    assert reply["type"] == p.ERROR and reason in reply["reason"]
    assert published == [] and table.snapshot() == before and table.registrations == 1


def test_a_joiner_gets_the_lowest_free_rank_and_a_donor_once_rounds_were_made():
    table = MembershipTable(3)
    for r in (0, 2):
        register(table, r)
        report(table, r, 4)
    reply, published = register(table, None, "s1", join=True)
    assert reply["rank"] == 1 and reply["donor"]["rank"] == 0 and reply["clock"] == 4  # lowest rank on ties
    assert kinds(published) == [(p.MEMBER, "join"), (p.DONATE, None), (p.VIEW, None)]
    assert published[1].body == {"to": 0, "rank": 1, "engine": ("127.0.0.1", 9000), "clock": 4}
    # While it waits for its state (reporting no round) the others' rounds move the slowest clock.
    for r in (0, 2):
        report(table, r, 6)
    assert table.progress().min_clock == 6
    report(table, 1, 6)  # it holds a state: its rounds count again
    report(table, 0, 7)
    report(table, 2, 7)
    assert table.progress().min_clock == 6


def test_a_joiner_that_misses_no_round_is_sent_no_state():
    table = MembershipTable(2)
    register(table, 0)
    report(table, 0, 5)
    reply, published = register(table, 1, join=True, clock=5)
    assert reply["donor"] is None and reply["clock"] == 5 and p.DONATE not in [pub.kind for pub in published]


def test_a_restarted_process_of_an_unknown_rank_is_treated_as_a_joiner_once_rounds_were_made():
    table = MembershipTable(2)
    register(table, 0)
    report(table, 0, 3)
    reply, _ = register(table, 1)
    assert reply["donor"]["rank"] == 0 and reply["clock"] == 3


def test_reports_move_the_slowest_clock_and_a_new_view_applies_ahead_of_the_fastest_peer():
    table = MembershipTable(2)
    register(table, 0)
    register(table, 1)
    reply, published = report(table, 0, 3, loss=0.5)
    assert reply is None and published == []  # rank 1 is still at 0
    reply, published = report(table, 1, 2, loss=1.5, message_bytes=1000.0)
    assert kinds(published) == [(p.CLOCK, None), (p.VIEW, None)]
    assert published[0].body == {"min_clock": 2}
    view = table.view()
    assert view.from_round == 3 + VIEW_LEAD and view.message_bytes.tolist() == [0.0, 1000.0]
    progress = table.progress()
    assert (progress.min_clock, progress.max_clock, progress.alive, progress.loss, progress.slowest) == (2, 3, 2, 1.0, 1)


def test_a_process_that_is_no_member_is_told_it_was_expelled():
    table = MembershipTable(2)
    register(table, 0)
    assert table.heartbeat(0, "s0") is None
    for reply in (table.heartbeat(0, "stale"), table.heartbeat(1, "s1"), report(table, 1, 1)[0],
                  table.state(1, "s1")[0], table.reach(1, "s1", [0])[0]):
        assert reply == {"type": p.ERROR, "reason": "expelled", "expelled": True}


def test_a_leave_is_published_and_a_stale_session_leaves_nobody():
    table = MembershipTable(2)
    register(table, 0)
    register(table, 1)
    assert table.leave(1, "stale") == [] and sorted(table.members()) == [0, 1]
    published = table.leave(1, "s1")
    assert kinds(published) == [(p.MEMBER, "leave"), (p.VIEW, None)]
    assert sorted(table.members()) == [0] and table.snapshot()["most_members"] == 2


def test_a_silent_member_is_declared_dead_after_its_start_up_grace():
    table = MembershipTable(2, startup_grace=5.0)
    register(table, 0)
    assert table.reap(time.monotonic() + 4.0) == []
    published = table.reap(time.monotonic() + 6.0)
    assert kinds(published) == [(p.MEMBER, "dead"), (p.VIEW, None)] and table.members() == {}


def test_a_member_whose_last_connection_closed_is_dead_after_one_interval():
    table = MembershipTable(2, heartbeat_interval=0.5, startup_grace=60.0)
    register(table, 0)
    for connection in (10, 11):  # requests and heartbeats
        table.note_connection(connection, 0, "s0")
    table.note_connection(12, 0, "stale")  # a connection is a member's only with its session
    assert table.connections == {10: 0, 11: 0}
    table.disconnected(10)
    assert table.reap(time.monotonic() + 1.0) == []  # its other connection is open
    table.disconnected(11)
    assert kinds(table.reap(time.monotonic() + 1.0)) == [(p.MEMBER, "dead"), (p.VIEW, None)]
    assert table.connections == {}


def test_a_joiner_whose_state_did_not_come_asks_a_donor_again():
    table = MembershipTable(2)
    register(table, 0)
    report(table, 0, 2)
    register(table, 1, join=True)
    reply, published = table.state(1, "s1")
    assert reply == {"type": p.OK, "donor": table.members()[0].to_dict()}
    assert kinds(published) == [(p.DONATE, None)] and published[0].body["clock"] == 2


def test_multicast_reach_makes_domains_and_a_bad_report_changes_nothing():
    table = MembershipTable(3)
    for r in range(3):
        register(table, r)
    for bad, error in (([0, 3], ValueError), ("all", TypeError), ([True], TypeError)):
        with pytest.raises(error):
            table.reach(0, "s0", bad)
    assert table.view().mcast_domain.tolist() == [-1, -1, -1]
    for r in range(2):
        reply, published = table.reach(r, f"s{r}", [1 - r, r])  # itself: left out
        assert reply == {"type": p.OK} and kinds(published) == [(p.VIEW, None)]
    assert table.view().mcast_domain.tolist() == [0, 0, -1]
    # A member that moves its engine is reached by nobody's probe any more.
    _, published = register(table, 1, engine=("127.0.0.1", 9999))
    assert kinds(published) == [(p.MEMBER, "update"), (p.VIEW, None)]
    assert table.view().mcast_domain.tolist() == [-1, -1, -1]


def _hand_over(members, clock=3, epoch=7):
    return Resume(clock=clock, epoch=epoch, members=[Member(rank=r, host="h", engine=("127.0.0.1", 9000 + r),
                                                             clock=c) for r, c in members.items()], view=None)


def test_a_successor_presumes_the_members_handed_over_until_they_register_themselves():
    table = MembershipTable(2, term=1)
    reply, published = register(table, 0, clock=3, resume=_hand_over({0: 3, 1: 3}))
    assert reply["type"] == p.OK and reply["epoch"] == 8 and reply["clock"] == 3
    assert sorted(table.members()) == [0, 1] and table.registered() == 1
    assert table.progress().min_clock == 3 and published[-1].kind == p.VIEW
    assert table.view().term == 1
    # A second hand-over is not adopted; rank 1's own registration confirms it.
    register(table, 1, clock=3, resume=_hand_over({5: 0}))
    assert sorted(table.members()) == [0, 1] and table.registered() == 2


def test_a_new_process_for_a_presumed_rank_replaces_it():
    table = MembershipTable(2, term=1)
    register(table, 0, clock=3, resume=_hand_over({0: 3, 1: 3}))
    reply, published = register(table, 1, "restarted")  # no hand-over: not the process presumed
    assert kinds(published)[:2] == [(p.MEMBER, "dead"), (p.VIEW, None)]
    assert (p.MEMBER, "join") in kinds(published) and reply["donor"]["rank"] == 0


def test_a_member_behind_the_job_after_a_failover_gets_the_state_from_a_donor():
    table = MembershipTable(2, term=1)
    register(table, 0, clock=3, resume=_hand_over({0: 3, 1: 3}))
    reply, published = register(table, 1, clock=1, resume=_hand_over({}, clock=1),
                                engine=("127.0.0.1", 9100))
    assert reply["donor"]["rank"] == 0
    assert kinds(published)[:2] == [(p.MEMBER, "update"), (p.DONATE, None)]
    assert published[1].body["engine"] == ("127.0.0.1", 9100)  # the new process's engine, not the presumed one's


def test_ticks_and_the_end_carry_the_job_so_far():
    table = MembershipTable(2, term=4)
    register(table, 0)
    report(table, 0, 2, loss=0.25)
    tick = table.tick()
    assert tick.kind == p.TICK and tick.body["epoch"] == 1 and tick.body["min_clock"] == 2
    assert tick.body["term"] == 4 and tick.body["progress"]["loss"] == 0.25
    table.leave(0, "s0")
    assert table.progress().loss == 0.25  # the last loss reported, once nobody is left
    ended = table.ended()
    assert ended.kind == p.ENDED and ended.body == {"term": 4, "most_members": 1, "most_planned": 1}
