"""Builds p2pcast datagrams in Python (header layout of native/wire.h), for tests that play a peer."""
from __future__ import annotations

import json
import math
import socket
import struct

MAGIC, VERSION = 0x7032, 1
DATA, ACK, PROBE, CLOSE, DONE = 1, 2, 3, 4, 5
HDR = struct.Struct("<HBBHHIIIHHQ")  # 32 bytes
MASK = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & MASK


def siphash24(key: bytes, data: bytes) -> int:
    k0, k1 = struct.unpack("<QQ", key)
    v0, v1, v2, v3 = k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573

    def rounds(n: int) -> None:
        nonlocal v0, v1, v2, v3
        for _ in range(n):
            v0 = (v0 + v1) & MASK; v1 = _rotl(v1, 13) ^ v0; v0 = _rotl(v0, 32)
            v2 = (v2 + v3) & MASK; v3 = _rotl(v3, 16) ^ v2
            v0 = (v0 + v3) & MASK; v3 = _rotl(v3, 21) ^ v0
            v2 = (v2 + v1) & MASK; v1 = _rotl(v1, 17) ^ v2; v2 = _rotl(v2, 32)

    tail = len(data) % 8
    for (m,) in struct.iter_unpack("<Q", data[: len(data) - tail]):
        v3 ^= m; rounds(2); v0 ^= m
    m = int.from_bytes(data[len(data) - tail:], "little") | ((len(data) & 0xFF) << 56)
    v3 ^= m; rounds(2); v0 ^= m
    v2 ^= 0xFF
    rounds(4)
    return v0 ^ v1 ^ v2 ^ v3


def datagram(type_: int, *, sender: int = 1, msg: int = 1, chunk: int = 0, nchunks: int = 1, chunk_size: int = 1440,
             meta_len: int = 24, pass_: int = 0, body: bytes = b"", job: int = 0, key: bytes | None = None,
             magic: int = MAGIC, version: int = VERSION) -> bytes:
    hdr = HDR.pack(magic, version, type_, sender, pass_, msg, chunk, nchunks, chunk_size // 8, meta_len // 8, 0)
    if key is None:
        tag = job
    else:
        tag = siphash24(key, struct.pack("<I", job) + hdr[:24] + bytes(8) + body)
    return hdr[:24] + struct.pack("<Q", tag) + body


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
