"""What a key holder can make a receiver allocate or send: partial messages are bounded by count
(per source and in all) and by the bytes they claim, oldest dropped first; the answers to a
message are bounded by 3x what it brought in. Legitimate traffic goes on meanwhile."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.transport.craft import DATA, PROBE, datagram

KEY, JOB = bytes(range(32)), 7


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def last_chunk(to: tuple[str, int], msg: int, nchunks: int, chunk_size: int) -> bytes:
    """A message's last chunk alone (8 bytes): the cheapest datagram that opens a partial message."""
    return datagram(DATA, sender=9, msg=msg, chunk=nchunks - 1, nchunks=nchunks, chunk_size=chunk_size,
                    meta_len=24, body=bytes(8), job=JOB, key=KEY, to=to)


def legit_message_arrives(sender, receiver) -> None:
    x = np.random.default_rng(0).random(250_000).astype(np.float32)
    handle = sender.send(1, [x], [receiver.address])
    d = receiver.recv(timeout=10)
    while d is not None and d.sender != sender.sender_id:  # a forged partial message that expired meanwhile
        d = receiver.recv(timeout=10)
    assert d is not None and d.complete
    np.testing.assert_array_equal(d.arrays[0], x)
    assert handle.wait(10)[0].result == "exact"


def test_partial_messages_per_source_are_bounded_oldest_dropped(channels, raw_peer):
    b = channels(key=KEY, job_id=JOB, max_partial_per_source=16)
    for msg in range(40):
        raw_peer.send(last_chunk(b.address, msg, nchunks=4, chunk_size=1440), b.address)
    legit_message_arrives(channels(sender_id=1, key=KEY, job_id=JOB), b)
    st = b.stats()
    assert st["drop_evicted"] == 40 - 16
    # an evicted message is gone for good: more of it is stale, not a new message
    raw_peer.send(last_chunk(b.address, 0, nchunks=4, chunk_size=1440), b.address)
    legit_message_arrives(channels(sender_id=2, key=KEY, job_id=JOB), b)
    assert b.stats()["drop_stale"] == st["drop_stale"] + 1


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="under ASan every free of a large block writes its shadow memory: RSS measures ASan")
def test_messages_claiming_gigabytes_each_stay_within_a_memory_budget(channels, raw_peer):
    b = channels(key=KEY, job_id=JOB)  # default quotas: 16 GiB claimed, so 4 such messages at once
    before = rss_bytes()
    for msg in range(10_000):  # 4 GiB claimed by each: 40 TiB in all, 48 bytes each on the wire
        raw_peer.send(last_chunk(b.address, msg, nchunks=65536, chunk_size=65536), b.address)
    legit_message_arrives(channels(sender_id=1, key=KEY, job_id=JOB), b)
    grown = rss_bytes() - before
    assert grown < 32 << 20, f"RSS grew {grown / 2**20:.0f} MiB (budget 32 MiB; ~130 MiB without quotas)"
    st = b.stats()
    assert st["drop_evicted"] >= 5_000, st  # the kernel may drop some of the 10,000 itself


def test_a_probe_for_a_huge_message_draws_at_most_3x_its_bytes(channels, raw_peer):
    b = channels(key=KEY, job_id=JOB)
    nchunks = 1 << 20  # 4 GiB in 4 KiB chunks: a whole bitmap would be 128 KiB of ACKs
    data = last_chunk(b.address, 5, nchunks=nchunks, chunk_size=4096)
    probe = datagram(PROBE, sender=9, msg=5, nchunks=nchunks, chunk_size=4096, meta_len=24, body=bytes(4),
                     job=JOB, key=KEY, to=b.address)
    sent_before = b.stats()["bytes_sent"]
    raw_peer.send(data, b.address)
    raw_peer.send(probe, b.address)
    legit_message_arrives(channels(sender_id=1, key=KEY, job_id=JOB), b)  # also: the probe was handled by now
    st = b.stats()
    legit_acks = st["bytes_sent"] - sent_before
    assert st["ack_limited"] >= 1
    # what b sent: the ACKs for the legitimate message, and at most 3x the 76 bytes for the forged one
    raw_peer.sock.settimeout(0.5)
    answered = 0
    try:
        while True:
            answered += len(raw_peer.sock.recv(65536))
    except TimeoutError:
        pass
    assert answered <= 3 * (len(data) + len(probe)), answered
    assert legit_acks >= answered

