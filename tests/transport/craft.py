"""Builds p2pcast datagrams in Python (header layout of native/wire.h), for tests that play a peer."""
from __future__ import annotations

import json
import math
import socket
import struct
import time

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from p2plearn.keys import job_tag

MAGIC, VERSION = 0x7032, 3
DATA, ACK, PROBE, CLOSE, DONE = 1, 2, 3, 4, 5
HDR = struct.Struct("<HBBHHIIIHHQII16s")  # 56 bytes
TAG_AT = 40
_counters: dict[int, int] = {}  # session -> the next counter datagram() gives it


def gmac(key: bytes, iv: bytes, data: bytes) -> bytes:
    """AES-256-GMAC: GCM's tag over `data` as additional data, nothing encrypted (native/auth.c)."""
    return AESGCM(key).encrypt(iv, b"", data)


def destination(to: tuple[str, int]) -> bytes:
    """What a tag covers of where a datagram goes (native/auth.c): address, port (little-endian), 0."""
    return socket.inet_aton(to[0]) + struct.pack("<HH", to[1], 0)


def datagram(type_: int, *, sender: int = 1, msg: int = 1, chunk: int = 0, nchunks: int = 1, chunk_size: int = 1440,
             meta_len: int = 24, pass_: int = 0, body: bytes = b"", job: str | int = "", key: bytes | None = None,
             to: tuple[str, int] = ("0.0.0.0", 0), session: int = 0x5E55, counter: int | None = None,
             magic: int = MAGIC, version: int = VERSION) -> bytes:
    """One datagram of job `job` as a sender with `session` makes it for receiver `to` (its tag covers
    that address); each call takes the session's next counter unless `counter` is given, so that
    repeated calls are not refused as replays."""
    if counter is None:
        counter = _counters.get(session, 0)
        _counters[session] = counter + 1
    hdr = HDR.pack(magic, version, type_, sender, pass_, msg, chunk, nchunks, chunk_size // 8, meta_len // 8,
                   session, counter, job_tag(str(job)), bytes(16))
    tag = bytes(16) if key is None else gmac(key, hdr[24:36], destination(to) + hdr[:TAG_AT] + body)
    return hdr[:TAG_AT] + tag + body


def message_chunks(arrays_bytes: list[bytes], descriptor: list | bytes, chunk_size: int) -> tuple[list[bytes], int]:
    """The flat [meta][segments] of a message cut in chunks, exactly as the engine lays it out
    (``descriptor``: the arrays' dtypes and shapes, or the raw bytes of a crafted one)."""
    app = descriptor if isinstance(descriptor, bytes) else json.dumps(descriptor, separators=(",", ":")).encode()
    meta_len = (24 + 24 * len(arrays_bytes) + len(app) + 7) // 8 * 8
    offs, off = [], meta_len
    for b in arrays_bytes:
        off = (off + 7) // 8 * 8
        offs.append(off)
        off += len(b)
    flat = bytearray(off)
    struct.pack_into("<IIQII", flat, 0, meta_len, len(arrays_bytes), off - meta_len, len(app), 0)
    for i, (o, b) in enumerate(zip(offs, arrays_bytes)):
        struct.pack_into("<QQQ", flat, 24 + 24 * i, o - meta_len, len(b), len(b))  # exact: need = len
        flat[o:o + len(b)] = b
    flat[24 + 24 * len(arrays_bytes):24 + 24 * len(arrays_bytes) + len(app)] = app
    n = math.ceil(len(flat) / chunk_size)
    return [bytes(flat[k * chunk_size:(k + 1) * chunk_size]) for k in range(n)], meta_len


class RawPeer:
    """A bare UDP socket that plays a sender or an attacker."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)

    def send(self, dgram: bytes, to: tuple[str, int]) -> None:
        self.sock.sendto(dgram, to)

    def close(self) -> None:
        self.sock.close()


def settled(ch, counter: str = "datagrams_sent", quiet: float = 0.2) -> dict[str, int]:
    """The channel's counters once `counter` stops moving for `quiet` s (its delayed ACKs and DONEs
    are out, or nothing more arrives)."""
    last = ch.stats()
    while True:
        time.sleep(quiet)
        now = ch.stats()
        if now[counter] == last[counter]:
            return now
        last = now
