"""At least 100,000 malformed datagrams at a live engine: none crashes it, each is counted as dropped,
and a valid message still goes through afterwards."""
from __future__ import annotations

import random
import time

import numpy as np

from tests.transport.craft import ACK, CLOSE, DATA, DONE, HDR, PROBE, datagram

DROPS = ("drop_bad_length", "drop_bad_magic", "drop_bad_version", "drop_bad_type", "drop_bad_tag",
         "drop_bad_index", "drop_bad_meta", "drop_unknown", "drop_stale", "drop_too_large")


def invalid_datagrams(rng: random.Random, job: int):
    """Yields datagrams each of which breaks at least one rule the engine checks."""
    ok = dict(sender=1, msg=rng.randrange(1 << 32), chunk=0, nchunks=4, chunk_size=1440, meta_len=48, job=job)
    kind = rng.randrange(16)
    if kind == 0:  # random bytes that do not start with the magic
        n = rng.randrange(0, 1600)
        b = bytearray(rng.randbytes(n))
        if n >= 2 and b[0] == 0x32 and b[1] == 0x70:
            b[0] ^= 1
        return bytes(b)
    if kind == 1:  # truncated below a header
        return datagram(DATA, body=b"x" * 1440, **ok)[: rng.randrange(0, 32)]
    if kind == 2:  # oversized: more payload than a chunk
        return datagram(DATA, body=rng.randbytes(1441 + rng.randrange(2000)), **ok)
    if kind == 3:  # a middle chunk cut short
        return datagram(DATA, body=rng.randbytes(rng.randrange(1, 1440)), **{**ok, "chunk": 1})
    if kind == 4:  # chunk index out of range
        return datagram(DATA, body=b"x" * 1440, **{**ok, "chunk": 4 + rng.randrange(1 << 20)})
    if kind == 5:  # zero or tiny chunk size, zero chunk count
        return datagram(DATA, body=b"x", **{**ok, rng.choice(["chunk_size", "nchunks"]): 0})
    if kind == 6:  # meta longer than the message, or shorter than its fixed part
        return datagram(DATA, body=b"x" * 1440, **{**ok, "meta_len": rng.choice([8, 16, 8 * 1000])})
    if kind == 7:  # claims a message larger than allowed
        return datagram(DATA, body=b"x" * 1440, **{**ok, "nchunks": 0xFFFFFFFF, "chunk_size": 65528})
    if kind == 8:  # wrong magic or version
        b = bytearray(datagram(DATA, body=b"x" * 1440, **ok))
        b[rng.choice([0, 1, 2])] ^= 1 + rng.randrange(255)
        return bytes(b)
    if kind == 9:  # unknown type
        b = bytearray(datagram(DATA, body=b"", **ok))
        b[3] = rng.choice([0, 6, 7, 255])
        return bytes(b)
    if kind == 10:  # ACK or DONE for no message in flight
        body = HDR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)[:24] if rng.random() < 0.5 else bytes(12)
        return datagram(ACK if len(body) == 24 else DONE, body=body, **ok)
    if kind == 11:  # PROBE / CLOSE with a body of the wrong size
        return datagram(rng.choice([PROBE, CLOSE]), body=rng.randbytes(5 + rng.randrange(100)), **ok)
    if kind == 12:  # the last chunk ends inside the meta
        return datagram(DATA, body=b"x" * 8, **{**ok, "chunk": 0, "nchunks": 1, "meta_len": 64})
    if kind == 13:  # wrong job id (the tag is the job when authentication is off)
        return datagram(DATA, body=b"x" * 1440, **{**ok, "job": job + 1})
    if kind == 14:  # a valid header with one random header byte flipped into the tag
        b = bytearray(datagram(DATA, body=b"x" * 1440, **ok))
        b[24 + rng.randrange(8)] ^= 1 + rng.randrange(255)
        return bytes(b)
    # random header fields after a valid magic/version: type/length/geometry all random
    b = bytearray(rng.randbytes(32 + rng.randrange(64)))
    b[0:3] = bytes([0x32, 0x70, 1])
    b[3] = rng.choice([0, 6, 9])
    return bytes(b)


def wait_until(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_fuzz_hundred_thousand_datagrams(channels, raw_peer):
    job = 1234
    rx = channels(job_id=job, max_message_bytes=64 << 20)
    rng = random.Random(0)
    pool = [invalid_datagrams(rng, job) for _ in range(20_000)]
    sent = 0
    for batch in range(25):
        for _ in range(4000):  # mutate the pool's datagrams further: random truncation keeps them invalid
            d = pool[rng.randrange(len(pool))]
            raw_peer.send(d, rx.address)
            sent += 1
        # let the engine catch up so that the kernel drops nothing on the way
        wait_until(lambda: rx.stats()["datagrams_received"] >= sent)
    st = rx.stats()
    assert sent >= 100_000
    assert st["datagrams_received"] == sent
    assert sum(st[k] for k in DROPS) == sent, {k: st[k] for k in DROPS}
    assert st["messages_delivered"] == st["messages_expired"] == 0
    assert rx.recv(timeout=0.05) is None
    for k in ("drop_bad_length", "drop_bad_magic", "drop_bad_version", "drop_bad_type", "drop_bad_tag",
              "drop_bad_index", "drop_unknown", "drop_too_large"):
        assert st[k] > 0, f"no datagram exercised {k}"

    tx = channels(sender_id=8, job_id=job)
    x = np.arange(100_000, dtype=np.float32)
    h = tx.send(5, [x], [rx.address])
    d = rx.recv(timeout=10)
    assert d is not None and d.complete
    np.testing.assert_array_equal(d.arrays[0], x)
    assert h.wait(10)[0].result == "exact"


def test_fuzz_with_authentication_rejects_forgeries_by_tag(channels, raw_peer):
    key = bytes(range(16))
    rx = channels(job_id=7, key=key)
    rng = random.Random(1)
    n = 5000
    for _ in range(n):  # well-formed headers, but nobody outside the job knows the key
        t = rng.choice([DATA, ACK, PROBE, CLOSE, DONE])
        raw_peer.send(datagram(t, body=rng.randbytes(rng.randrange(0, 1440)), job=7, msg=rng.randrange(9),
                               nchunks=rng.randrange(1, 9), key=bytes(16 - i for i in range(16))), rx.address)
    wait_until(lambda: rx.stats()["datagrams_received"] >= n)
    assert rx.stats()["drop_bad_tag"] == n
    assert rx.recv(timeout=0.05) is None
