"""The inbox keeps only the rounds a peer may legitimately send, and a few model states."""

import numpy as np

from p2plearn.sync.inbox import MAX_STATES, STATE_FLAG, Inbox
from p2plearn.transport import Delivery, Reason


class Feed:
    """A channel that delivers the given message ids, one per recv."""

    def __init__(self, ids):
        self.ids = list(ids)

    def recv(self, timeout=None):
        if not self.ids:
            return None
        return Delivery(sender=1, msg_id=self.ids.pop(0), arrays=[np.zeros(4, np.float32)],
                        mask=np.ones(1, bool), reason=Reason.COMPLETE, source=("", 0), fractions=[1.0])


def test_rounds_outside_the_window_and_surplus_states_are_dropped_and_counted():
    window = (9, 30)
    ids = [5, 9, 10, 30, 31, 10**9] + [STATE_FLAG | c for c in range(MAX_STATES + 3)]
    inbox = Inbox(Feed(ids), lambda: window)
    inbox.drain()
    assert [d.msg_id for d in inbox.take(0, 10**10)] == [9, 10, 30]
    assert inbox.dropped == 3 + 3  # rounds 5, 31 and 10**9; the three oldest states
    states = [inbox.take_state(1, 0.0) for _ in range(MAX_STATES)]
    assert [d.msg_id & ~STATE_FLAG for d in states] == [3, 4, 5, 6]  # the newest are kept
    assert inbox.take_state(1, 0.0) is None
