"""The datagram tags' GMAC: the engine's GHASH (native/ghash.c, VPCLMULQDQ where the CPU has it: 512-bit
with AVX-512, else 256-bit, which P2P_GHASH_256 forces) gives OpenSSL's bits and an independent AES-GCM's
(the `cryptography` package), for every length and every way of cutting the same bytes into pieces:
peers with and without it agree on every tag."""
from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from p2plearn.transport._native import check, ffi, lib


def gmac(key: bytes, iv: bytes, pieces: list[bytes], portable: bool) -> bytes:
    segs = ffi.new("p2p_segment[]", max(len(pieces), 1))
    keep = [ffi.from_buffer(p) for p in pieces]
    for s, buf, p in zip(segs, keep, pieces):
        s.ptr, s.len = buf, len(p)
    tag = ffi.new("uint8_t[16]")
    check(lib.p2p_gmac(key, iv, segs, len(pieces), int(portable), tag))
    return bytes(tag)


def reference(key: bytes, iv: bytes, data: bytes) -> bytes:
    return AESGCM(key).encrypt(iv, b"", data)  # no plaintext: the output is the tag alone


def cuts(rng: np.random.Generator, data: bytes) -> list[bytes]:
    """data in 1-6 pieces at random places (empty pieces included)."""
    at = sorted(rng.integers(0, len(data) + 1, size=rng.integers(0, 6)))
    return [data[a:b] for a, b in zip([0, *at], [*at, len(data)])]


@pytest.mark.parametrize("width", ["widest", "256"])
@pytest.mark.parametrize("length", [0, 1, 15, 16, 17, 31, 33, 48, 255, 256, 257, 511, 512, 513, 1000, 1472, 4096,
                                    8192 + 5, 65000])
def test_the_engines_gmac_is_aes_gcms_for_every_length_and_cut(length, width, monkeypatch):
    if width == "256":
        monkeypatch.setenv("P2P_GHASH_256", "1")  # read when a key is made: each gmac call makes one
    rng = np.random.default_rng(length)
    for _ in range(5):
        key, iv = os.urandom(32), os.urandom(12)
        data = rng.integers(0, 256, size=length, dtype=np.uint8).tobytes()
        want = reference(key, iv, data)
        assert gmac(key, iv, [data], portable=True) == want
        assert gmac(key, iv, [data], portable=False) == want
        assert gmac(key, iv, cuts(rng, data), portable=False) == want


def test_a_changed_byte_changes_the_tag():
    key, iv = os.urandom(32), os.urandom(12)
    data = bytearray(os.urandom(3000))
    tag = gmac(key, iv, [bytes(data)], portable=False)
    for at in (0, 15, 16, 255, 256, 2999):
        data[at] ^= 1
        assert gmac(key, iv, [bytes(data)], portable=False) != tag
        data[at] ^= 1


def test_the_engine_refuses_a_gmac_it_cannot_compute():
    with pytest.raises(Exception, match="all-zero key"):
        gmac(bytes(32), bytes(12), [b"x"], portable=False)

