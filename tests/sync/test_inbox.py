"""The inbox keeps only the rounds a peer may legitimately send, and one model state per sender."""

import time

import numpy as np
import pytest

from p2plearn.sync.inbox import MAX_STATES, STATE_FLAG, Inbox
from p2plearn.sync.kept import OVER_QUOTA, SUPERSEDED, KeptMessages
from p2plearn.transport import Delivery, Reason, TransportError


class Feed:
    """A channel that delivers the given (sender, message id) pairs, one per recv."""

    def __init__(self, items):
        self.items = [item if isinstance(item, tuple) else (1, item) for item in items]

    def recv(self, timeout=None):
        if not self.items:
            return None
        sender, msg_id = self.items.pop(0)
        if isinstance(msg_id, Exception):
            raise msg_id  # what Channel.recv raises about a delivery it could not decode
        return Delivery(sender=sender, msg_id=msg_id, arrays=[np.zeros(4, np.float32)],
                        mask=np.ones(1, bool), reason=Reason.COMPLETE, source=("", 0), fractions=[1.0])


def test_rounds_outside_the_window_are_dropped_and_counted():
    window = (9, 30)
    inbox = Inbox(Feed([5, 9, 10, 30, 31, 10**9]), lambda: window)
    inbox.drain()
    assert [d.msg_id for d in inbox.take(0, 10**10)] == [9, 10, 30]
    assert inbox.dropped == 3  # rounds 5, 31 and 10**9


def test_states_are_kept_one_per_sender_and_for_at_most_as_many_senders_as_members():
    members = 6
    # sender 1 sends three states (each supersedes the last); senders 2..8 one each: 8 senders
    items = [(1, STATE_FLAG | c) for c in range(3)] + [(s, STATE_FLAG | 10 * s) for s in range(2, 9)]
    inbox = Inbox(Feed(items), lambda: (0, 0), lambda: members)
    inbox.drain()
    assert inbox.dropped == 2 + 2  # two superseded states of sender 1; the two oldest senders (1 and 2)
    assert inbox.take_state(1, 0.0) is None and inbox.take_state(2, 0.0) is None
    assert inbox.take_state(5, 0.0).msg_id == STATE_FLAG | 50
    assert [inbox.take_state(None, 0.0).sender for _ in range(members - 1)] == [3, 4, 6, 7, 8]  # by arrival
    assert inbox.take_state(None, 0.0) is None
    small = Inbox(Feed([(s, STATE_FLAG) for s in range(10)]), lambda: (0, 0))  # no members known
    small.drain()
    assert small.dropped == 10 - MAX_STATES


def test_a_sender_heard_at_a_later_round_is_not_waited_for_and_senders_heard_are_bounded():
    # sender 2 delivered round 40, beyond the window (dropped, yet heard); sender 3 only round 4
    inbox = Inbox(Feed([(2, 40), (3, 4)]), lambda: (4, 20), lambda: 2)
    inbox.drain()
    assert inbox.newest == {2: 40, 3: 4} and inbox.dropped == 1
    t0 = time.monotonic()
    inbox.wait_round(5, {2}, t0 + 30.0, lambda s: True)  # 2 has moved past round 5: no wait
    assert time.monotonic() - t0 < 5.0
    inbox.wait_round(5, {2, 3}, time.monotonic() + 0.2, lambda s: True)  # 3 may still send round 5
    assert time.monotonic() - t0 >= 0.2
    many = Inbox(Feed([(s, 7) for s in range(100)]), lambda: (0, 10), lambda: 0)  # no members known
    many.drain()
    assert list(many.newest) == list(range(100 - MAX_STATES, 100))  # the least recently heard forgotten


def test_a_delivery_the_channel_cannot_decode_is_dropped_and_counted_and_the_next_ones_kept():
    # a descriptor with a zero and a huge dimension made Channel._wrap's reshape raise ValueError
    unusable = [ValueError("cannot reshape array of size 0 into shape (0,9223372036854775808)"),
                OverflowError("Python int too large to convert to C ssize_t"), TypeError("bad dtype")]
    inbox = Inbox(Feed([9, *((1, e) for e in unusable), 10, (2, STATE_FLAG | 3)]), lambda: (0, 20), lambda: 2)
    inbox.drain()
    assert [d.msg_id for d in inbox.take(0, 20)] == [9, 10]
    assert inbox.take_state(2, 0.0).msg_id == STATE_FLAG | 3
    assert inbox.drops == {"undecodable (ValueError)": 1, "undecodable (OverflowError)": 1,
                           "undecodable (TypeError)": 1}
    assert inbox.dropped == 3


def test_a_closed_channel_still_ends_the_wait():
    class Closed:
        def recv(self, timeout=None):
            raise TransportError(9, "channel is closed")

    with pytest.raises(TransportError):
        Inbox(Closed(), lambda: (0, 20)).pump(0.0)


def delivery(sender, msg_id, value=0.0, size=4):
    return Delivery(sender=sender, msg_id=msg_id, arrays=[np.full(size, value, np.float32)], mask=np.ones(1, bool),
                    reason=Reason.COMPLETE, source=("", 0), fractions=[1.0])


class Deliveries:
    """A channel that delivers the given deliveries, one per recv."""

    def __init__(self, deliveries):
        self.deliveries = list(deliveries)

    def recv(self, timeout=None):
        return self.deliveries.pop(0) if self.deliveries else None


def test_ids_that_wrap_around_keep_the_window_and_count_the_late_and_those_too_far_ahead():
    # ids 0..15 wrap around; the window is 14..18, i.e. 14, 15, 0, 1, 2
    inbox = Inbox(Feed([13, 14, 15, 0, 2, 3, 6, 10]), lambda: (14, 18), ids=16, state_flag=0, beyond="too far")
    inbox.drain()
    assert inbox.late == 2 and inbox.drops == {"too far": 2}  # 13 and 10 late (behind by 1, 4); 3 and 6 beyond
    assert inbox.dropped == 4 and inbox.newest == {}  # ids that wrap around have no newest
    assert [d.msg_id for d in inbox.take(15, 15 + 2)] == [15, 0]  # 14 is before: counted late
    assert inbox.late == 3 and [d.msg_id for d in inbox.take(2, 2)] == [2] and inbox.pending() == 0


def test_candidates_per_id_and_sender_and_bytes_per_sender_are_bounded():
    big = 4 * 4  # bytes of one delivery's arrays
    kept = KeptMessages(candidates=2, sender_bytes=3 * big, replace=False)
    arriving = [delivery(1, 5, v) for v in (1, 2, 3)] + [delivery(1, 6, 4), delivery(1, 7, 5), delivery(2, 5, 6)]
    inbox = Inbox(Deliveries(arriving), lambda: (5, 9), kept=kept)
    inbox.drain()
    # sender 1: a third candidate for id 5 is refused, and its id 7 is over its 3 deliveries' bytes
    assert inbox.refused == {OVER_QUOTA: 2} and inbox.pending() == 4
    assert [d.arrays[0][0] for d in inbox.take(5, 5)] == [1, 2, 6]  # by sender, then arrival
    inbox = Inbox(Deliveries([delivery(1, 5, 1), delivery(1, 5, 2)]), lambda: (5, 9))  # training: one, the newest
    inbox.drain()
    assert inbox.drops == {SUPERSEDED: 1} and [d.arrays[0][0] for d in inbox.take(5, 5)] == [2]


def test_admitted_deliveries_are_claimed_by_a_waiting_caller_or_filed_and_each_drop_is_told_once():
    warned = []
    inbox = Inbox(Deliveries([delivery(0, 7), delivery(0, 8), delivery(1, 7), delivery(1, 8), delivery(2, 8)]),
                  lambda: (7, 9), admit=lambda d: "own" if d.sender == 0 else None,
                  warn=lambda reason, sender: warned.append((reason, sender)))
    claimed = []
    while inbox.pump(0.0, claim=lambda d: d.msg_id == 7 and not claimed.append(d.sender)):
        pass
    assert claimed == [1] and inbox.drops == {"own": 2} and warned == [("own", 0)]
    assert [(d.sender, d.msg_id) for d in inbox.take(7, 9)] == [(1, 8), (2, 8)]


def test_arrivals_hand_out_a_rounds_messages_as_they_come_and_say_when_the_wait_is_idle():
    """Round 5's messages, taken as they are filed (sender 2's was kept before the wait), a None for
    each poll that brought nothing, and the end once every live sender is in; sender 4 is dead."""
    polls = iter([(2, 5), None, (3, 6), None, (1, 5)])

    class Slow:
        def recv(self, timeout=None):
            item = next(polls, None)
            return None if item is None else Feed([item]).recv()

    inbox = Inbox(Slow(), lambda: (5, 20))
    inbox.pump(0.0)  # sender 2's, before the round waits
    got = list(inbox.arrivals(5, {1, 2, 3, 4}, time.monotonic() + 30.0, lambda s: s != 4, moved_on=6))
    assert [None if d is None else (d.sender, d.msg_id) for d in got] == [(2, 5), None, None, (1, 5)]
    assert inbox.pending() == 1  # sender 3's round 6, filed for later (and 3 counts as moved on)
    assert list(inbox.arrivals(5, {1}, time.monotonic() - 1.0, lambda s: True)) == []  # past its time: no wait
