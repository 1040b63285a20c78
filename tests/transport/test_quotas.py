"""What a key holder can make a receiver allocate or send: a message larger than the job sends is
refused; partial messages are bounded by count (per source and in all) and by the bytes they claim,
oldest dropped first; the answers to a message are bounded by 3x what it brought in. Legitimate
traffic goes on meanwhile."""
from __future__ import annotations

import os
import socket
import struct
import time

import numpy as np
import pytest
import torch

from p2plearn.transport import CHUNK_CLAIM, message_bytes
from tests.train.conftest import job, on_peers  # noqa: F401 - `job` is a fixture
from tests.transport.craft import DATA, PROBE, datagram, settled

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
