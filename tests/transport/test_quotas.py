"""What a key holder can make a receiver allocate or send: a message larger than the job sends is
refused; partial messages are bounded by count (per source and in all) and by the bytes they claim,
oldest dropped first; delivered messages waiting for recv are bounded by count and bytes, the
source holding the most losing its oldest; the answers to a message are bounded by 3x what it
brought in. Legitimate traffic goes on meanwhile."""
from __future__ import annotations

import contextlib
import os
import socket
import struct
import time

import numpy as np
import pytest
import torch

from p2plearn.transport import CHUNK_CLAIM, message_bytes
from tests.train.conftest import job, on_peers  # noqa: F401 - `job` is a fixture
from tests.transport.craft import DATA, PROBE, RawPeer, datagram, message_chunks, settled

KEY, JOB = bytes(range(32)), 7
# A flood's deliveries have all been counted once none came for this long: exact counts are asserted
# after it, so it must outlast the I/O thread's longest stall on a busy 2-core machine.
QUIET_S = 1.0


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


def whole_message(to: tuple[str, int], msg: int, chunk_size: int = 64) -> bytes:
    """A finished message (no arrays) in one datagram of 88 bytes, claiming one chunk of `chunk_size`
    bytes: the cheapest way to make a receiver queue a delivery."""
    (chunk,), meta_len = message_chunks([], [], chunk_size)
    return datagram(DATA, sender=9, msg=msg, nchunks=1, chunk_size=chunk_size, meta_len=meta_len, body=chunk,
                    job=JOB, key=KEY, to=to)


def take_all(receiver) -> list:
    """Every delivery waiting at `receiver` (none comes within 0.5 s after the last)."""
    got = []
    while (d := receiver.recv(timeout=0.5)) is not None:
        got.append(d)
    return got


def legit_message_arrives(sender, receiver, size: int = 250_000) -> None:
    x = np.random.default_rng(0).random(size).astype(np.float32)
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
        raw_peer.send(last_chunk(b.address, msg, nchunks=65536, chunk_size=CHUNK_CLAIM), b.address)
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


def test_message_bytes_is_what_a_receiver_must_accept(channels):
    x = np.arange(100_000, dtype=np.float32)
    rx = channels(max_message_bytes=message_bytes([x]), max_datagram=1472)
    tx = channels(sender_id=1, max_datagram=1472)
    tx.send(1, [x], [rx.address])
    got = rx.recv(timeout=10)
    assert got is not None and got.complete
    np.testing.assert_array_equal(got.arrays[0], x)
    larger = np.zeros(x.size + 1000, dtype=np.float32)  # 4,000 bytes more: three chunks
    assert tx.send(2, [larger], [rx.address], deadline=1.0).wait(10)[0].result != "exact"
    assert rx.stats()["drop_too_large"] > 0 and rx.recv(timeout=0.2) is None


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="under ASan every free of a large block writes its shadow memory: RSS measures ASan")
def test_a_key_holder_allocates_at_most_a_few_of_the_largest_messages(channels, raw_peer):
    """Bounded by max_message_bytes (the job's largest message): larger claims are refused, and
    partial messages together claim 4 of them (the default), however many a member opens."""
    largest, chunk = 256 << 10, 16 << 10
    b = channels(key=KEY, job_id=JOB, max_message_bytes=largest)
    before = rss_bytes()
    for msg in range(1000):  # 4 GiB claimed by each: refused before anything is allocated
        raw_peer.send(last_chunk(b.address, msg, nchunks=65536, chunk_size=CHUNK_CLAIM), b.address)
    n = largest // chunk
    meta = struct.pack("<IIQII", 24, 0, largest - 24, 0, 0)  # no segments: all data, to be written
    for msg in range(1000, 1300):  # within the bound, each written but for its last chunk: stays partial
        for k in range(n - 1):
            raw_peer.send(datagram(DATA, sender=9, msg=msg, chunk=k, nchunks=n, chunk_size=chunk, meta_len=24,
                                   body=(meta if k == 0 else b"").ljust(chunk, b"\1"), job=JOB, key=KEY,
                                   to=b.address), b.address)
    st = settled(b, "datagrams_received", quiet=0.3)
    grown = rss_bytes() - before
    assert st["drop_too_large"] >= 500, st  # the kernel may drop some of the 1,000 itself
    assert st["drop_evicted"] >= 100 and st["receiving_messages"] <= 4, st
    # 300 x 240 KiB written (70 MiB) without the bound on claims; 4 x 256 KiB with it
    assert grown < 16 << 20, f"RSS grew {grown / 2**20:.0f} MiB (budget 16 MiB)"
    legit_message_arrives(channels(sender_id=1, key=KEY, job_id=JOB), b, size=50_000)  # 200 KB: within the bound


def test_delivered_messages_waiting_for_recv_are_bounded_a_flooder_drops_its_own_oldest(channels, raw_peer):
    b = channels(key=KEY, job_id=JOB, max_queued_messages=32)
    for msg in range(1000):  # a key holder finishes 1,000 messages between two of b's recv calls
        raw_peer.send(whole_message(b.address, msg), b.address)
    st = settled(b, "messages_delivered", quiet=QUIET_S)
    delivered = st["messages_delivered"]
    assert delivered >= 500, st  # the kernel may drop some of the 1,000 itself
    assert (st["queued_messages"], st["queued_bytes"]) == (32, 32 * 64), st
    assert st["drop_queue_full"] == delivered - 32, st
    x = np.random.default_rng(0).random(250_000).astype(np.float32)
    honest = channels(sender_id=1, key=KEY, job_id=JOB)
    assert honest.send(1, [x], [b.address]).wait(10)[0].result == "exact"  # sent after the flood
    got = take_all(b)
    assert len(got) == 32 and [d.sender for d in got].count(1) == 1
    mine = next(d for d in got if d.sender == 1)
    assert mine.complete
    np.testing.assert_array_equal(mine.arrays[0], x)
    flood = [d.msg_id for d in got if d.sender == 9]
    assert flood == sorted(flood) and flood[0] >= delivered - 31, flood  # its newest kept, in order
    st = b.stats()
    assert st["drop_queue_full"] == delivered - 31 and st["queued_messages"] == st["queued_bytes"] == 0, st


def test_a_flood_from_many_sources_leaves_an_honest_sender_its_share(channels):
    """Eight sources fill the queue; a sender holding less than each of them loses nothing."""
    b = channels(key=KEY, job_id=JOB, max_queued_messages=32)
    with contextlib.ExitStack() as stack:
        floods = [stack.enter_context(contextlib.closing(RawPeer())) for _ in range(8)]
        for msg in range(200):
            for peer in floods:
                peer.send(whole_message(b.address, msg), b.address)
        st = settled(b, "messages_delivered", quiet=QUIET_S)
    assert st["queued_messages"] == 32 and st["drop_queue_full"] >= 500, st
    honest = channels(sender_id=1, key=KEY, job_id=JOB)
    x = np.arange(10_000, dtype=np.float32)
    for msg in (1, 2, 3):  # at most 3 of 33 waiting: fewer than the largest flooding source (30 among 8: 4)
        assert honest.send(msg, [x + msg], [b.address]).wait(10)[0].result == "exact"
    got = take_all(b)
    assert len(got) == 32
    mine = [d for d in got if d.sender == 1]
    assert [d.msg_id for d in mine] == [1, 2, 3]
    for d in mine:
        np.testing.assert_array_equal(d.arrays[0], x + d.msg_id)
    st = b.stats()
    assert st["drop_queue_full"] == st["messages_delivered"] - 32 and st["queued_messages"] == 0, st


def test_waiting_messages_claim_at_most_the_partial_byte_quota_by_default(channels, raw_peer):
    """88 bytes on the wire that claim a whole chunk each: 1,000 of them would hold 62 MiB."""
    largest = 256 << 10
    b = channels(key=KEY, job_id=JOB, max_message_bytes=largest)
    quota = 4 * (largest + CHUNK_CLAIM)  # max_partial_bytes' default, which max_queued_bytes follows
    for msg in range(1000):
        raw_peer.send(whole_message(b.address, msg, chunk_size=CHUNK_CLAIM), b.address)
    st = settled(b, "messages_delivered", quiet=QUIET_S)
    assert st["messages_delivered"] >= 500, st
    assert st["queued_messages"] == quota // CHUNK_CLAIM and st["queued_bytes"] <= quota, st
    assert st["drop_queue_full"] == st["messages_delivered"] - st["queued_messages"], st
    x = np.random.default_rng(0).random(50_000).astype(np.float32)  # 200 KB: claims 4 chunks
    honest = channels(sender_id=1, key=KEY, job_id=JOB)
    assert honest.send(1, [x], [b.address]).wait(10)[0].result == "exact"  # waiting at b now
    after = b.stats()
    assert after["drop_queue_full"] > st["drop_queue_full"] and after["queued_bytes"] <= quota, after
    mine = [d for d in take_all(b) if d.sender == 1]  # the flood's oldest made room for it
    assert len(mine) == 1 and mine[0].complete
    np.testing.assert_array_equal(mine[0].arrays[0], x)


@pytest.mark.slow
def test_the_optimizer_sizes_its_engine_by_the_model(job):
    """A training peer's engine refuses a message much larger than the model (and so than anything
    the job sends), and takes the job's own messages: a small model's, each claiming a whole
    loopback chunk (64 KiB) of memory, many times its bytes."""
    models = [torch.nn.Linear(10, 10) for _ in range(2)]  # 440 bytes of parameters
    model_bytes = sum(p.numel() * p.element_size() for p in models[0].state_dict().values())

    def claims_then_trains(rank, opt):
        if rank == 0:  # tags off: no runtime secret in this in-process job
            nchunks = 64 * model_bytes // 1024
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
                raw.sendto(datagram(DATA, sender=1, msg=1, chunk=nchunks - 1, nchunks=nchunks, chunk_size=1024,
                                    meta_len=24, body=bytes(8), job=opt.runtime.job_id), opt.channel.address)
            deadline = time.monotonic() + 10
            while opt.channel.stats()["drop_too_large"] < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
        opt.step()
        return opt.channel.stats()["drop_too_large"], opt.last_round.merged

    assert on_peers(job, models, claims_then_trains) == [(1, 1), (0, 1)]
