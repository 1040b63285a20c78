"""Point-to-point operations that match, fail loudly and cannot be flooded: two ranks'
PointToPoint over their own engines, in one process, and a third engine that sends in rank 1's
name (a key holder's forgery)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from p2plearn.distributed import pointtopoint
from p2plearn.distributed.pointtopoint import DATA, MAX_READY, READY, PointToPoint
from p2plearn.distributed.sender import CollectiveError, CollectiveTimeout, Sender
from tests.distributed.engines import two_ranks


class Done:
    """A ``finished`` callback: ``wait()`` gives the operation's error (None: it completed)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.error: BaseException | None = None

    def __call__(self, error: BaseException | None) -> None:
        self.error = error
        self._event.set()

    def wait(self, timeout: float = 20.0) -> BaseException | None:
        assert self._event.wait(timeout), "the operation did not end"
        return self.error


@pytest.fixture
def pair():
    """Two ranks' PointToPoint (timeout 4 s), a forger sending as rank 1, the departures."""
    with two_ranks(lambda ch, r, engines, links, departed: PointToPoint(
            Sender(ch, r, 2, engines, links, 4.0, departed, 1 << 20), timeout=4.0)) as made:
        yield made


def header(kind: int, tag: int, n: int) -> np.ndarray:
    return np.array([kind, tag, n], dtype=np.int64)


def test_messages_match_by_tag_and_in_order_within_one(pair):
    (a, b), _, _ = pair
    sends = [Done() for _ in range(4)]
    for i, tag in enumerate([5, 5, 9, 5]):
        a.send(np.full(3, float(i), np.float32), 1, tag, sends[i])
    got = {i: np.zeros(3, np.float32) for i in range(4)}
    receives = [Done() for _ in range(4)]
    b.recv(got[2], 0, 9, receives[2])  # the other tag first
    for i in (0, 1, 3):
        b.recv(got[i], 0, 5, receives[i])
    assert [d.wait() for d in sends + receives] == [None] * 8
    assert [got[i][0] for i in range(4)] == [0.0, 1.0, 2.0, 3.0]


def test_a_send_waits_for_its_receive_and_fails_at_the_timeout_without_one(pair):
    (a, b), _, _ = pair
    done = Done()
    t0 = time.monotonic()
    a.send(np.ones(3, np.float32), 1, 0, done)
    error = done.wait()
    assert isinstance(error, CollectiveTimeout) and "its receive was not posted" in str(error), error
    assert time.monotonic() - t0 > 3.5  # it waited for the group's timeout (4 s)


@pytest.mark.parametrize("nbytes", [64, 4096])
def test_a_small_send_ends_once_handed_to_the_engine_and_a_large_one_at_its_acknowledgement(pair, monkeypatch, nbytes):
    """Rank 1 posts its receive (a READY, forged here), then its engine stops: the acknowledgement
    never comes. A send of at most EAGER_BYTES has ended by then, as gloo's ends once its bytes are in
    the socket (its failure is counted); a larger one fails. Ending a small send at its acknowledgement
    put a one-way trip between a send and the next operation: on a link of latency L, a ping-pong's
    half took 3L (DATA, the acknowledgement, the answer's READY), L now."""
    monkeypatch.setattr(pointtopoint, "EAGER_BYTES", 1000)
    (a, b), forger, _ = pair
    forger.send(0, [header(READY, 0, 0)], [a.sender.channel.address]).wait(5)
    b.sender.channel.close()
    payload = np.ones(nbytes // 4, np.float32)
    done = Done()
    a.send(payload, 1, 0, done)
    error = done.wait()
    if nbytes <= 1000:
        assert error is None
        deadline = time.monotonic() + 20
        while a.failed_after_end == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert a.failed_after_end == 1
    else:
        assert isinstance(error, CollectiveError) and "send #0 to rank 1" in str(error), error
        assert a.failed_after_end == 0


def test_a_small_send_that_ended_carries_the_values_it_was_given(pair):
    """Once a send ended its tensor is the caller's again: the engine sends a copy, not what the
    caller writes next (it may not have sent a datagram yet when the send ends)."""
    (a, b), _, _ = pair
    for _ in range(3):
        got, received = np.zeros(50_000, np.float32), Done()
        b.recv(got, 0, 0, received)
        payload, sent = np.ones(50_000, np.float32), Done()
        a.send(payload, 1, 0, sent)
        assert sent.wait() is None
        payload[:] = 7.0
        assert received.wait() is None
        np.testing.assert_array_equal(got, 1.0)


def test_a_departed_peer_fails_a_waiting_receive_at_once(pair):
    (a, _), _, departed = pair
    done = Done()
    a.recv(np.zeros(3, np.float32), 1, 0, done)
    departed[1] = "was declared dead by the job"
    error = done.wait()
    # named by the membership, not the group's timeout (CollectiveTimeout, "no message came")
    assert type(error) is CollectiveError and "rank 1 was declared dead" in str(error), error


def test_a_message_of_other_shapes_fails_the_receive(pair, monkeypatch):
    monkeypatch.setattr(pointtopoint, "MISMATCH_S", 0.5)
    (a, b), _, _ = pair
    sent, received = Done(), Done()
    a.send(np.ones(8, np.float32), 1, 0, sent)
    b.recv(np.zeros(3, np.float32), 0, 0, received)
    error = received.wait()
    assert isinstance(error, CollectiveError) and "shapes float32[8]" in str(error), error
    assert b.refused["shapes or dtypes of another receive"] == 1


def test_forgeries_are_refused_counted_and_bounded(pair):
    (a, b), forger, _ = pair
    victim = a.sender.channel.address
    junk = np.full(4, 1e30, np.float32)
    forger.send(0, [header(DATA, 0, 0), junk], [victim]).wait(5)  # nobody asked for it
    forger.send(1, [np.zeros(2, np.float32)], [victim]).wait(5)  # no header
    for i in range(MAX_READY + 10):  # promises of receives that rank 1 never posted: bounded
        forger.send(2 + i, [header(READY, 3, i)], [victim])
    deadline = time.monotonic() + 10
    while sum(a.refused.values()) < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert a.refused == {"a message no receive asked for": 1, "not a point-to-point message": 1,
                         f"more than {MAX_READY} receives ahead": 10}, a.refused
    # a forged message of the right shapes for a posted receive is taken (poisoning, as for
    # collectives); one of other shapes is refused and the real one taken after it
    got, received, sent = np.zeros(4, np.float32), Done(), Done()
    a.recv(got, 1, 0, received)  # (posted once recv returns)
    forger.send(10_000, [header(DATA, 0, 0), np.zeros(9, np.float32)], [victim]).wait(5)
    b.send(np.arange(4, dtype=np.float32), 0, 0, sent)
    assert received.wait() is None and sent.wait() is None
    np.testing.assert_array_equal(got, np.arange(4))
    assert a.refused["shapes or dtypes of another receive"] == 1
