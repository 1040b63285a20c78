"""Collectives that fail loudly and cannot be desynchronised: two ranks' Collectives over their own
engines, in threads, and a third engine that sends in rank 1's name (a key holder's forgery)."""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch.distributed as dist

from p2plearn.distributed import collectives
from p2plearn.distributed.collectives import AHEAD, CANDIDATES, PHASES, CollectiveError, Collectives
from p2plearn.transport import Channel
from p2plearn.transport.delivery import Delivery, Reason
from tests.distributed.engines import two_ranks


@pytest.fixture
def group():
    """Two ranks' Collectives (timeout 8 s), a forger's channel sending as rank 1, and the
    membership's departures (rank -> why) the group reads."""
    with two_ranks(lambda ch, r, engines, links, departed: Collectives(
            ch, r, 2, engines, links, timeout=8.0, departed=departed, max_message_bytes=1 << 20,
            kept_bytes=1 << 20)) as made:
        yield made


def both(ranks, run):
    """run(rank's Collectives) on both ranks at once: each one's result or the exception it raised."""
    def call(c):
        try:
            return run(c)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            return exc
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(call, ranks))


def test_collective_errors_are_torch_backend_errors():
    # what raises from gloo (DistBackendError, a RuntimeError) is what a user's except catches here
    assert issubclass(CollectiveError, dist.DistBackendError) and issubclass(CollectiveError, RuntimeError)
    assert issubclass(collectives.CollectiveTimeout, CollectiveError)


def test_different_shapes_raise_on_every_rank(group, monkeypatch):
    monkeypatch.setattr(collectives, "MISMATCH_S", 1.0)
    ranks, _, _ = group
    arrays = [np.ones(8, np.float32), np.ones(3, np.float32)]  # rank 0 reduces 8 elements, rank 1 three
    raised_at = {}

    def run(c):
        try:
            c.allreduce(0, [arrays[c.rank]], "sum")
        finally:
            raised_at[c.rank] = time.monotonic()

    t0 = time.monotonic()
    outcomes = both(ranks, run)
    assert all(isinstance(o, CollectiveError) for o in outcomes), outcomes
    # the rank that received a part of other shapes says so, after MISMATCH_S; the other (which here
    # waits for a part that never comes) raises too, by its timeout or, in a process group, as soon
    # as the membership says the failed rank left (tests/distributed/test_backend.py)
    mismatched = [r for r, o in enumerate(outcomes) if "shapes" in str(o)]
    assert mismatched and all(raised_at[r] - t0 < 6 for r in mismatched), (outcomes, raised_at)
    assert ranks[mismatched[0]].mailbox.refused["shapes or dtypes of another collective"] == 1


def test_forged_messages_of_other_shapes_are_refused_and_the_real_ones_taken(group):
    ranks, forger, _ = group
    victim = ranks[0].channel.address
    # in rank 1's name: messages for this collective's phases and the next ones, of wrong shapes,
    # all arriving before rank 1's own
    for msg_id in range(3 * PHASES):
        forger.send(msg_id, [np.full(5, 1e9, np.float32)], [(*victim, 0.0)]).wait(5)
    # large enough that each rank aggregates a part: rank 0 receives from rank 1 in both phases
    values = [np.arange(50000, dtype=np.float32), np.arange(50000, dtype=np.float32) * 3]
    for seq in range(3):
        arrays = [v.copy() for v in values]
        outcomes = both(ranks, lambda c: c.allreduce(seq, [arrays[c.rank]], "avg"))
        assert not any(isinstance(o, Exception) for o in outcomes), outcomes
        assert all(np.allclose(a, np.arange(50000) * 2) for a in arrays)
    assert ranks[0].mailbox.refused["shapes or dtypes of another collective"] == 3 * PHASES


def test_messages_kept_ahead_are_bounded(group):
    ranks, forger, _ = group
    victim = ranks[0].channel.address
    payload = [np.zeros(15000, np.float32)]  # 60 KB, as the attack measured
    far = [(AHEAD + 5) * PHASES + i for i in range(50)]  # beyond the window
    for msg_id in far:
        forger.send(msg_id, payload, [(*victim, 0.0)]).wait(5)
    # one collective ahead, more candidates than are kept (from engines of their own: an engine
    # refuses a message id it already had from one source as stale)
    near = [Channel(sender_id=1) for _ in range(CANDIDATES + 3)]
    try:
        for ch in near:
            ch.send(2, payload, [(*victim, 0.0)]).wait(5)
    finally:
        for ch in near:
            ch.close()
    arrays = [np.ones(4, np.float32), np.ones(4, np.float32)]
    # every forgery was acknowledged, so it waits in the victim's engine: collective 0 files them all
    outcomes = both(ranks, lambda c: c.allreduce(0, [arrays[c.rank]], "sum"))
    assert not any(isinstance(o, Exception) for o in outcomes), outcomes
    refused = ranks[0].mailbox.refused
    assert refused[f"more than {AHEAD} collectives ahead"] == len(far)
    assert refused["over the quota of messages kept ahead"] == len(near) - CANDIDATES
    assert ranks[0].mailbox.pending() == CANDIDATES  # the messages kept ahead
    # the next collective (id 2) refuses the kept forgeries by shape and takes rank 1's own message
    arrays = [np.full(4, 2.0, np.float32), np.full(4, 5.0, np.float32)]
    outcomes = both(ranks, lambda c: c.allreduce(1, [arrays[c.rank]], "sum"))
    assert not any(isinstance(o, Exception) for o in outcomes), outcomes
    assert all(np.allclose(a, 7.0) for a in arrays)


def test_a_departed_rank_fails_the_collective_waiting_for_it(group):
    ranks, _, departed = group

    def depart_soon():
        time.sleep(0.5)
        departed[1] = "was declared dead by the job"

    with ThreadPoolExecutor(1) as pool:
        pool.submit(depart_soon)
        t0 = time.monotonic()
        with pytest.raises(CollectiveError, match=r"rank 1 was declared dead"):
            ranks[0].allreduce(0, [np.ones(100, np.float32)], "sum")  # rank 1 never calls it
    assert time.monotonic() - t0 < 4  # not the group's 8 s timeout
    with pytest.raises(CollectiveError, match=r"rank 1 was declared dead"):
        ranks[0].broadcast(1, np.ones(4, np.float32), root=0)  # nor does a send to it wait


def test_a_send_that_is_never_acknowledged_raises_naming_the_rank(group):
    ranks, _, _ = group
    ranks[1].channel.close()  # its process is gone; the membership has not said so (yet)
    with pytest.raises(CollectiveError, match=r"rank 1 stopped acknowledging"):
        ranks[0].broadcast(0, np.ones(1000, np.float32), root=0)


def test_a_message_that_ended_before_its_layout_arrived_is_loss_not_a_message_of_other_shapes(group, monkeypatch,
                                                                                             caplog):
    """On a lossy link a sender's message can end at its deadline before its first datagrams (its
    layout) arrive: the engine hands it over without arrays. A lossy all-reduce counts it as lost,
    warns of no refusal, and goes on with what it has."""
    ranks, _, _ = group
    rank0, seq = ranks[0], 3
    pump = rank0.mailbox.pump
    layoutless = [Delivery(sender=1, msg_id=seq * PHASES, arrays=None, mask=np.zeros(1, bool), reason=Reason.CLOSED,
                           source=rank0.channel.address, fractions=[])]

    def pump_after_the_layoutless(timeout, claim=None):
        if layoutless and claim is not None:
            return claim(layoutless.pop())
        return pump(timeout, claim)

    monkeypatch.setattr(rank0.mailbox, "pump", pump_after_the_layoutless)
    values = np.full(1000, 3.0, np.float32)
    with caplog.at_level(logging.WARNING, logger="p2plearn.distributed"):
        rank0.allreduce(seq, [values], "avg", bounds=[0.5], deadline=0.3)  # rank 1 never calls it
    assert not layoutless and rank0.mailbox.refused == {collectives.LAYOUT_LOST: 1}
    assert not [r for r in caplog.records if "refused" in r.getMessage()], caplog.text
    assert np.all(values == 3.0)  # nothing of rank 1's arrived: this rank's own values stand


def test_a_message_over_the_limit_raises_on_every_rank_before_anything_is_sent(group):
    ranks, _, _ = group
    big = [np.ones(1 << 19, np.float32) for _ in range(2)]  # 2 MiB: over the group's 1 MiB
    outcomes = both(ranks, lambda c: c.broadcast(0, big[c.rank], root=0))
    assert all(isinstance(o, CollectiveError) and "P2PLEARN_MAX_MESSAGE_MB" in str(o) for o in outcomes), outcomes
