"""The inbox keeps only the rounds a peer may legitimately send, and one model state per sender."""

import time

import numpy as np
import pytest

from p2plearn.sync.inbox import MAX_STATES, STATE_FLAG, Inbox
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
