"""Slow close through the real engine on loopback: a receiver whose arrivals fall behind its planned
time (its bytes at its pacing rate) ends "slow" by S x planned, the others as they would anyway.
A receiver's `drop_prob` stands for a downlink slower than its pace: what arrives per second is
what the sender's projection measures, whatever the reason it is short."""
from __future__ import annotations

import math

import numpy as np
import pytest

from p2plearn.transport import Reason, TransportError

DATAGRAM = 1472
CHUNK = (DATAGRAM - 56) & ~7  # payload per datagram (wire header: 56 bytes)
PER_DGRAM = 56 + 42           # wire header + IPv4/UDP/Ethernet, as pacing counts them
PACE = 2e6                    # bytes/s


def planned_s(size: int, rate: float = PACE) -> float:
    """The message's wire bytes at `rate`, its meta left out: at most the engine's planned time."""
    return (size + math.ceil(size / CHUNK) * PER_DGRAM) / rate


def recv_from(ch, timeout: float = 10.0):
    d = ch.recv(timeout=timeout)
    assert d is not None, "nothing delivered"
    return d


def test_a_receiver_far_slower_than_its_pace_ends_slow_on_the_projection_the_other_exactly(channels):
    a = channels(sender_id=1, max_datagram=DATAGRAM)
    fast, slow = channels(sender_id=2), channels(sender_id=3, drop_prob=0.8, seed=3)  # a fifth arrives
    size, factor = 1_000_000, 2.5
    data = np.arange(size, dtype=np.uint8)
    h = a.send(1, [data], [(*fast.address, PACE), (*slow.address, PACE)], slow_close=factor)
    st_fast, st_slow = h.wait(30)
    limit = factor * planned_s(size)
    assert st_fast.result == "exact"
    assert st_slow.result == "slow" and st_slow.delivered < 1
    # Its ACKs measured a fifth of the pace from its first 64 datagrams on: the projection closed it
    # with about a tenth of the message there, where the limit would have let half of it through
    # (counted in datagrams, not seconds: a busy host delays the close's handshake, not the count).
    assert st_slow.delivered < 0.3 and st_slow.elapsed_s < limit + 2.0, (st_slow, limit)
    assert 0 < st_slow.ack_rate < 0.5 * PACE  # the rate it was closed on goes to the round's report
    assert a.stats()["slow_closed"] == 1
    np.testing.assert_array_equal(recv_from(fast).arrays[0], data)
    partial = recv_from(slow)
    assert partial.reason == Reason.CLOSED and not partial.complete  # as at a deadline: what arrived


def test_a_receiver_whose_acks_stop_ends_slow_at_the_limit(channels):
    a = channels(sender_id=1, max_datagram=DATAGRAM)
    silent = channels(sender_id=2, drop_prob=0.99, seed=5)  # too few arrive for a single rate sample
    size, factor = 500_000, 2.0
    h = a.send(1, [np.zeros(size, np.uint8)], [(*silent.address, PACE)], slow_close=factor)
    (st,) = h.wait(30)
    limit = factor * planned_s(size)
    assert st.result == "slow"
    assert limit <= st.elapsed_s < limit + 2.0, (st.elapsed_s, limit)  # the close's handshake, on a busy host


@pytest.mark.parametrize("factor, want", [(0.0, "exact"), (1.5, "slow")])
def test_off_waits_for_every_chunk_and_on_closes_what_cannot_make_its_plan(channels, factor, want):
    # Half arrives: exact delivery needs about twice the planned time, past 1.5 x planned.
    a = channels(sender_id=1, max_datagram=DATAGRAM)
    lossy = channels(sender_id=2, drop_prob=0.5, seed=11)
    h = a.send(1, [np.zeros(300_000, np.uint8)], [(*lossy.address, PACE)], slow_close=factor)
    (st,) = h.wait(30)
    assert st.result == want
    assert a.stats()["slow_closed"] == (want == "slow")


def test_an_unpaced_receiver_has_no_plan_and_is_never_closed_slow(channels):
    a = channels(sender_id=1, max_datagram=DATAGRAM)
    lossy = channels(sender_id=2, drop_prob=0.5, seed=11)
    h = a.send(1, [np.zeros(300_000, np.uint8)], [lossy.address], slow_close=1.0)
    (st,) = h.wait(30)
    assert st.result == "exact"


def test_a_loss_bound_met_first_closes_early_not_slow(channels):
    # A fifth of the chunks arrives in the first pass and a bound of 0.9 needs a tenth: the
    # projection counts only what the bound still needs, so the close the bound allows comes first
    # (all of it, at a fifth of the pace, would project past 2.5 x planned).
    a = channels(sender_id=1, max_datagram=DATAGRAM)
    lossy = channels(sender_id=2, drop_prob=0.8, seed=3)
    h = a.send(1, [np.zeros(1_000_000, np.uint8)], [(*lossy.address, PACE)], loss_bounds=0.9, slow_close=2.5)
    (st,) = h.wait(30)
    assert st.result in ("early_closed", "exact")


@pytest.mark.parametrize("factor", [0.5, -1.0, float("nan"), float("inf")])
def test_slow_close_outside_zero_or_at_least_one_is_refused(channels, factor):
    a, b = channels(sender_id=1), channels(sender_id=2)
    with pytest.raises(TransportError, match="slow_factor"):
        a.send(1, [np.zeros(10, np.uint8)], [(*b.address, PACE)], slow_close=factor)


def test_a_message_planned_shorter_than_the_pacers_first_wake_up_is_delivered_not_closed_unseen(channels):
    # 4 KB at 20 MB/s is planned 0.2 ms, the pacer's first batch leaves at ~0.8 ms: a close at the
    # limit would reach a receiver that never saw the message, which ignores it (a forged CLOSE must
    # deliver nothing), and the message would be lost
    a = channels(sender_id=1, max_datagram=1472)
    b = channels(sender_id=2)
    data = np.arange(1024, dtype=np.float32)
    (st,) = a.send(1, [data], [(*b.address, 20e6)], slow_close=2.0).wait(10)
    d = b.recv(timeout=5)
    assert d is not None and d.reason == Reason.COMPLETE
    np.testing.assert_array_equal(d.arrays[0], data)
    assert st.result == "exact"
