"""At least 100,000 malformed datagrams at a live engine while legitimate messages flow: none crashes
it, each is counted as dropped, and every legitimate message arrives intact. Run with tags off, and
with tags on and the fuzz signed (a key holder), at the default caps."""
from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from p2plearn.transport import CHUNK_CLAIM
from tests.transport.craft import ACK, CLOSE, DATA, DONE, HDR, PROBE, VERSION, datagram

DROPS = ("drop_bad_length", "drop_bad_magic", "drop_bad_version", "drop_bad_type", "drop_other_job", "drop_bad_tag",
         "drop_replayed", "drop_bad_index", "drop_bad_meta", "drop_unknown", "drop_stale", "drop_too_large")


def invalid_datagrams(rng: random.Random, job: int, to: tuple[str, int], key: bytes | None = None):
    """Yields datagrams each of which breaks at least one rule the engine checks (signed with
    ``key`` for receiver `to` when given, so that they reach the checks behind the tag)."""
    ok = dict(sender=1, msg=rng.randrange(1 << 32), chunk=0, nchunks=4, chunk_size=1440, meta_len=48, job=job, key=key,
              to=to)
    kind = rng.randrange(16)
    if kind == 0:  # random bytes that do not start with the magic
        n = rng.randrange(0, 1600)
        b = bytearray(rng.randbytes(n))
        if n >= 2 and b[0] == 0x32 and b[1] == 0x70:
            b[0] ^= 1
        return bytes(b)
    if kind == 1:  # truncated below a header
        return datagram(DATA, body=b"x" * 1440, **ok)[: rng.randrange(0, HDR.size)]
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
    if kind == 7:  # claims a message larger than allowed, or chunks larger than a datagram carries
        return datagram(DATA, body=b"x" * 1440, **{**ok, "nchunks": 0xFFFFFFFF,
                                                   "chunk_size": rng.choice([CHUNK_CLAIM, CHUNK_CLAIM + 8, 65528])})
    if kind == 8:  # wrong magic or version
        b = bytearray(datagram(DATA, body=b"x" * 1440, **ok))
        b[rng.choice([0, 1, 2])] ^= 1 + rng.randrange(255)
        return bytes(b)
    if kind == 9:  # unknown type
        b = bytearray(datagram(DATA, body=b"", **ok))
        b[3] = rng.choice([0, 6, 7, 255])
        return bytes(b)
    if kind == 10:  # ACK or DONE for no message in flight
        body = bytes(24) if rng.random() < 0.5 else bytes(12)
        return datagram(ACK if len(body) == 24 else DONE, body=body, **ok)
    if kind == 11:  # PROBE / CLOSE with a body of the wrong size
        return datagram(rng.choice([PROBE, CLOSE]), body=rng.randbytes(5 + rng.randrange(100)), **ok)
    if kind == 12:  # the last chunk ends inside the meta
        return datagram(DATA, body=b"x" * 8, **{**ok, "chunk": 0, "nchunks": 1, "meta_len": 64})
    if kind == 13:  # another job's, or (signed) for another receiver
        other = {"job": job + 1} if key is None or rng.random() < 0.5 else {"to": (to[0], to[1] + 1)}
        return datagram(DATA, body=b"x" * 1440, **{**ok, **other})
    if kind == 14:  # a valid datagram with one byte of its job id flipped, or with a key, of its session,
        b = bytearray(datagram(DATA, body=b"x" * 1440, **ok))  # counter, job id or tag
        b[rng.randrange(24, HDR.size) if key else rng.randrange(36, 40)] ^= 1 + rng.randrange(255)
        return bytes(b)
    # random header fields after a valid magic/version: type/length/geometry all random
    b = bytearray(rng.randbytes(HDR.size + rng.randrange(64)))
    b[0:3] = bytes([0x32, 0x70, VERSION])
    b[3] = rng.choice([0, 6, 9])
    return bytes(b)


def wait_until(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def fuzz_drops(st: dict[str, int]) -> int:
    """Drops the fuzz causes; stale datagrams come from the legitimate flow's own retransmissions."""
    return sum(st[k] for k in DROPS if k != "drop_stale")


@pytest.mark.parametrize("key", [None, bytes(range(32))], ids=["tags-off", "tags-on-signed-fuzz"])
def test_fuzz_hundred_thousand_datagrams_while_legitimate_messages_flow(channels, raw_peer, key):
    job = 1234
    rx = channels(job_id=job, key=key)  # the default caps
    tx = channels(sender_id=8, job_id=job, key=key)
    rng = random.Random(0)
    pool = [invalid_datagrams(rng, job, rx.address, key) for _ in range(20_000)]
    stop, legit, errors = threading.Event(), [], []

    def flow() -> None:  # legitimate messages the whole time; each must arrive intact
        try:
            while not stop.is_set():
                x = np.random.default_rng(len(legit)).random(50_000).astype(np.float32)
                h = tx.send(len(legit) + 1, [x], [rx.address])
                d = rx.recv(timeout=10)
                assert d is not None and d.complete and d.msg_id == len(legit) + 1, d
                np.testing.assert_array_equal(d.arrays[0], x)
                assert h.wait(10)[0].result == "exact"
                legit.append(d.msg_id)
        except BaseException as exc:  # noqa: BLE001 - reported in the test's thread
            errors.append(exc)

    flowing = threading.Thread(target=flow)
    flowing.start()
    sent = 0
    try:
        for batch in range(25):
            for _ in range(4000):
                raw_peer.send(pool[rng.randrange(len(pool))], rx.address)
                sent += 1
            # let the engine catch up so that the kernel drops nothing on the way
            wait_until(lambda: fuzz_drops(rx.stats()) >= sent)
    finally:
        stop.set()
        flowing.join(30)
    assert not errors, errors
    st = rx.stats()
    assert sent >= 100_000 and len(legit) >= 3, (sent, len(legit))
    assert fuzz_drops(st) == sent, {k: st[k] for k in DROPS}
    assert st["messages_delivered"] == len(legit) and st["messages_expired"] == 0
    assert rx.recv(timeout=0.05) is None
    behind_the_tag = ("drop_bad_length", "drop_bad_index", "drop_unknown", "drop_too_large")
    tag = ("drop_bad_tag",) if key else ()  # without tags, nothing fails one
    for k in ("drop_bad_magic", "drop_bad_version", "drop_bad_type", "drop_other_job", *tag, "drop_replayed",
              *behind_the_tag):
        assert st[k] > 0, f"no datagram exercised {k}"


def test_fuzz_with_authentication_rejects_forgeries_by_tag(channels, raw_peer):
    key = bytes(range(32))
    rx = channels(job_id=7, key=key)
    rng = random.Random(1)
    n = 5000
    for _ in range(n):  # well-formed headers, but nobody outside the job knows the key
        t = rng.choice([DATA, ACK, PROBE, CLOSE, DONE])
        raw_peer.send(datagram(t, body=rng.randbytes(rng.randrange(0, 1440)), job=7, msg=rng.randrange(9),
                               nchunks=rng.randrange(1, 9), key=bytes(32 - i for i in range(32)), to=rx.address),
                      rx.address)
    wait_until(lambda: rx.stats()["datagrams_received"] >= n)
    assert rx.stats()["drop_bad_tag"] == n
    assert rx.recv(timeout=0.05) is None
