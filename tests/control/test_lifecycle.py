"""A control client's life cycle: one phase, changed only along the allowed transitions."""

import threading

import pytest

from control_helpers import JOB, wait_event
from p2plearn.control import Client, ControlError, Coordinator, CoordinatorDead
from p2plearn.control.lifecycle import TRANSITIONS, Lifecycle, Phase


def lifecycle():
    return Lifecycle(threading.Condition(), JOB, give_up=60.0)


def test_every_phase_has_its_transitions_and_the_outcomes_are_final():
    assert set(TRANSITIONS) == set(Phase)
    for final in (Phase.ENDED, Phase.DEAD, Phase.CLOSED):
        assert not TRANSITIONS[final]
    assert {phase for phase, to in TRANSITIONS.items() if Phase.DEAD in to} == {Phase.SEEKING, Phase.MEMBER_SEEKING}
    assert all(Phase.CLOSED in to for phase, to in TRANSITIONS.items() if phase.listening)


def test_a_member_seeks_follows_leaves_and_hears_the_end():
    life = lifecycle()
    assert life.phase is Phase.OBSERVING and life.phase.following and not life.phase.member
    assert life.admit() and life.phase is Phase.MEMBER
    assert life.admit() and life.phase is Phase.MEMBER  # registering again updates the address
    assert life.seek() and life.phase is Phase.MEMBER_SEEKING
    assert life.phase.member and not life.phase.following
    assert life.follow() and life.phase is Phase.MEMBER
    assert life.leave() and life.phase is Phase.LEFT  # True: the coordinator is to be told
    assert not life.seek() and life.phase is Phase.LEFT  # a peer that left follows no successor
    assert life.phase.listening and not life.phase.in_job
    assert life.move(Phase.ENDED) and not life.phase.listening and life.phase.over
    with pytest.raises(ControlError, match="job ended"):
        life.check("tcp://127.0.0.1:1")


def test_a_refused_transition_leaves_the_phase_that_won():
    life = lifecycle()
    assert not life.move(Phase.DEAD)  # only a client looking for its coordinator gives up on it
    assert not life.follow() and life.phase is Phase.OBSERVING
    assert not life.leave() and life.phase is Phase.LEFT  # an observer has nothing to tell
    assert not life.leave() and life.phase is Phase.LEFT
    assert life.admit() and life.phase is Phase.MEMBER  # registering again takes part again
    assert life.seek() and life.move(Phase.DEAD)
    assert not life.move(Phase.CLOSED) and not life.admit() and life.phase is Phase.DEAD
    with pytest.raises(CoordinatorDead, match="last at tcp://127.0.0.1:1"):
        life.check("tcp://127.0.0.1:1")


def test_an_expelled_member_keeps_seeking_as_an_observer():
    life = lifecycle()
    life.admit()
    life.seek()
    assert life.expel() and life.phase is Phase.SEEKING
    assert not life.expel()
    assert life.follow() and life.phase is Phase.OBSERVING
    assert life.move(Phase.CLOSED) and not life.follow() and not life.admit() and life.phase is Phase.CLOSED
    with pytest.raises(ControlError, match="closed"):
        life.check("tcp://127.0.0.1:1")


def test_a_transition_wakes_a_wait_on_the_clients_condition():
    cond = threading.Condition()
    life = Lifecycle(cond, JOB, give_up=60.0)
    life.seek()
    woke = []

    def wait():
        with cond:
            woke.append(cond.wait_for(lambda: life.phase.over, timeout=10))

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert life.move(Phase.DEAD)
    waiter.join(10)
    assert woke == [True]


def test_a_client_says_its_phase_through_its_life(key):
    coord = Coordinator(JOB, key, world_size=2, heartbeat=0.2).start()
    clients = [Client(coord.address, JOB, key, rank=r, connect_timeout=5.0) for r in (0, 1)]
    try:
        assert [c.phase for c in clients] == [Phase.OBSERVING] * 2
        for c in clients:
            c.register(("127.0.0.1", 9000 + c.rank))
        assert [c.phase for c in clients] == [Phase.MEMBER] * 2
        clients[0].leave()
        assert clients[0].phase is Phase.LEFT
        coord.end()
        assert wait_event(clients[1], "job_ended", timeout=5) is not None
        assert clients[1].phase is Phase.ENDED and clients[1].ended and not clients[1].following
        for c in clients:
            c.close()
        # The end is the job's outcome: a closed client still says so; one closed before is closed.
        assert clients[1].phase is Phase.ENDED and clients[1].ended
        assert clients[0].phase in (Phase.ENDED, Phase.CLOSED)
        with pytest.raises(ControlError, match="job ended"):
            clients[1].fetch_view()
    finally:
        for c in clients:
            c.close()
        coord.stop()
