"""A peer joining a running job receives the model state from a live donor, through the data engine."""

import numpy as np
import pytest

from control_helpers import wait_event

try:
    from p2plearn.transport import Channel
except ImportError as exc:  # the engine's Python face is built separately
    Channel = None
    REASON = f"p2plearn.transport.Channel is not importable yet ({exc})"


@pytest.mark.skipif(Channel is None, reason="" if Channel else REASON)
def test_joiner_receives_the_state_from_its_donor(connect):
    rng = np.random.default_rng(0)
    state = [rng.standard_normal(1000).astype(np.float32), rng.standard_normal((64, 32)).astype(np.float32)]
    channels = []
    try:
        donor_ch = Channel(host="127.0.0.1", port=0, sender_id=0)
        channels.append(donor_ch)
        donor = connect(0, donor_ch.address)
        donor.report(7)
        assert donor.wait_min_clock(7, timeout=5)

        joiner_ch = Channel(host="127.0.0.1", port=0, sender_id=1)
        channels.append(joiner_ch)
        joiner = connect(None, joiner_ch.address, join=True)
        assert joiner.donor is not None and joiner.donor.rank == 0 and joiner.start_clock == 7

        # The donor is told whom to send to; the state travels through the data engine.
        event = wait_event(donor, "donate", timeout=2)
        assert event is not None and event.rank == joiner.rank and tuple(event.engine) == joiner_ch.address
        donor_ch.send(event.clock, state, [tuple(event.engine)], loss_bounds=0.0).wait()

        delivery = joiner_ch.recv(timeout=5.0)
        assert delivery is not None
        assert delivery.sender == 0 and delivery.msg_id == 7
        for got, sent in zip(delivery.arrays, state):
            np.testing.assert_array_equal(np.asarray(got).reshape(sent.shape), sent)
        joiner.report(8)
        donor.report(8)
        assert joiner.wait_min_clock(8, timeout=5)  # it takes part from the next round
    finally:
        for ch in channels:
            ch.close()


def test_a_peer_taken_for_dead_rejoins_without_a_donor_when_it_missed_no_round(coordinator, connect):
    donor = connect(0, ("127.0.0.1", 9000))
    stalled = connect(1, ("127.0.0.1", 9001))
    donor.report(5)
    stalled.report(5)
    assert donor.wait_min_clock(5, timeout=5)
    with coordinator._lock:  # as if its heartbeats had stopped (a stall at start-up, say)
        coordinator._publish(*coordinator._table.remove(1, "dead"))
    event = wait_event(stalled, "readmitted", timeout=5)
    assert event is not None and event.engine is None  # nobody is asked to send it a state
    assert stalled.donor is None and stalled.start_clock == 5
    assert wait_event(donor, "donate", timeout=1) is None


def test_a_joiner_gets_a_donor_that_holds_its_state(coordinator, connect):
    ahead = connect(0, ("127.0.0.1", 9000))
    behind = connect(1, ("127.0.0.1", 9001))
    ahead.report(3)
    behind.report(2)
    assert ahead.wait_min_clock(2, timeout=5)
    first = connect(None, ("127.0.0.1", 9002), join=True)
    assert first.donor.rank == 0 and first.start_clock == 3
    ahead.leave()
    # The first joiner is the most advanced now, but it holds no state yet: the next gets rank 1's.
    second = connect(None, ("127.0.0.1", 9003), join=True)
    assert second.donor.rank == 1 and second.start_clock == 2
    first.report(4)  # it has its state and trains: a donor like any other from now on
    third = connect(None, ("127.0.0.1", 9004), join=True)
    assert third.donor.rank == first.rank


def test_a_restarted_process_registering_into_a_running_job_gets_a_donor(coordinator, connect):
    first = connect(0, ("127.0.0.1", 9000))
    first.report(4)
    assert first.wait_min_clock(4, timeout=5)
    restarted = connect(1, ("127.0.0.1", 9001))  # its rank, as at the start, but rounds have been made
    assert restarted.donor is not None and restarted.donor.rank == 0 and restarted.start_clock == 4
    event = wait_event(first, "donate", timeout=2)
    assert event is not None and event.rank == 1


def test_a_joiner_without_its_state_asks_again(coordinator, connect):
    donor = connect(0, ("127.0.0.1", 9000))
    donor.report(2)
    assert donor.wait_min_clock(2, timeout=5)
    joiner = connect(None, ("127.0.0.1", 9001), join=True)
    assert wait_event(donor, "donate", timeout=2) is not None
    assert joiner.ask_for_state().rank == 0  # the state went astray: the donor is asked once more
    again = wait_event(donor, "donate", timeout=2)
    assert again is not None and again.rank == joiner.rank
