"""wire.c's decoders of network input, alone (built as a small library, called through cffi), over
arbitrary bytes: the header decoder gives exactly the fields of a valid header or a refusal the
engine counts by reason; the meta decoder accepts only tables whose segments lie in order, apart,
aligned and inside the message, accepts every table a sender lays out, gives back exactly what its
encoder wrote (in the bytes this file's `table` lays out), and refuses a meta cut short or too large."""
from __future__ import annotations

import os
import struct
import subprocess

import pytest
from cffi import FFI
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.transport.craft import HDR, MAGIC, VERSION

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NATIVE = os.path.join(ROOT, "native")
CDEF = """
struct wire_hdr {
    uint8_t type;
    uint16_t sender, pass;
    uint32_t msg, chunk, nchunks, chunk_size, meta_len;
    uint64_t session;
    uint32_t counter, job;
};
int wire_get_hdr(const uint8_t *in, size_t len, struct wire_hdr *h);
struct wire_meta {
    uint32_t meta_len, nseg;
    uint64_t data_len;
    uint32_t app_len;
    const uint8_t *app;
};
struct wire_segment { uint64_t off, len, need; };
uint32_t wire_meta_len(uint32_t nseg, uint32_t app_len);
void wire_put_meta(uint8_t *out, const struct wire_meta *m);
void wire_put_meta_segment(uint8_t *out, uint32_t i, const struct wire_segment *seg);
int wire_get_meta(const uint8_t *p, uint32_t meta_len, uint64_t cap, uint32_t chunk, uint64_t total,
                  struct wire_meta *m);
int wire_get_meta_segment(const uint8_t *p, const struct wire_meta *m, uint32_t i, struct wire_segment *seg);
"""
META_MAX = 0xFFFF * 8  # the header carries the meta length / 8 in a u16
# wire_get_hdr's refusals, as datagram.c counts them
BAD_LENGTH, BAD_MAGIC, BAD_VERSION, BAD_TYPE = -1, -2, -3, -4
TYPES = range(1, 7)


@pytest.fixture(scope="module")
def wire(tmp_path_factory):
    lib_path = tmp_path_factory.mktemp("wire") / "libwire.so"
    subprocess.run(["gcc", "-O1", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I", NATIVE,
                    os.path.join(NATIVE, "wire.c"), "-o", str(lib_path)], check=True)
    ffi = FFI()
    ffi.cdef(CDEF)
    return ffi, ffi.dlopen(str(lib_path))


# Mostly headers near valid ones (every field random, magic/version/type often right), some any bytes.
near_headers = st.builds(
    lambda magic, version, type_, rest, cut: (struct.pack("<HBB", magic, version, type_) + rest)[:cut],
    st.sampled_from([MAGIC, MAGIC ^ 1, 0]), st.sampled_from([VERSION, VERSION - 1, 255]), st.integers(0, 255),
    st.binary(min_size=HDR.size, max_size=HDR.size + 40), st.integers(0, HDR.size + 40))


@settings(max_examples=500, deadline=None)
@given(st.one_of(near_headers, st.binary(max_size=80)))
def test_the_header_decoder_gives_a_valid_headers_fields_or_a_counted_refusal(wire, data):
    ffi, lib = wire
    h = ffi.new("struct wire_hdr *")
    rc = lib.wire_get_hdr(ffi.new("uint8_t[]", data) if data else ffi.NULL, len(data), h)
    if len(data) < HDR.size:
        assert rc == BAD_LENGTH
        return
    magic, version, type_, sender, pass_, msg, chunk, nchunks, chunk8, meta8, session, counter, job, _ = \
        HDR.unpack(data[:HDR.size])
    expected = BAD_MAGIC if magic != MAGIC else BAD_VERSION if version != VERSION else \
        BAD_TYPE if type_ not in TYPES else 0
    assert rc == expected
    if rc == 0:
        assert (h.type, h.sender, getattr(h, "pass"), h.msg, h.chunk, h.nchunks, h.chunk_size, h.meta_len, h.session,
                h.counter, h.job) == \
            (type_, sender, pass_, msg, chunk, nchunks, chunk8 * 8, meta8 * 8, session, counter, job)


def table(segments: list[tuple[int, int, int]], data_len: int, app: bytes, meta_len: int | None = None) -> bytes:
    """A meta as a sender lays it out: fixed part, (offset, length, need) per segment, app blob."""
    size = (24 + 24 * len(segments) + len(app) + 7) // 8 * 8 if meta_len is None else meta_len
    out = bytearray(size)
    struct.pack_into("<IIQII", out, 0, size, len(segments), data_len, len(app), 0)
    for i, entry in enumerate(segments):
        struct.pack_into("<QQQ", out, 24 + 24 * i, *entry)
    out[24 + 24 * len(segments):24 + 24 * len(segments) + len(app)] = app
    return bytes(out)


def parse(wire, meta: bytes, cap: int, chunk: int, total: int = 0) -> tuple[int, int]:
    """The meta decoder's segment count and data length, or (-1, 0) where it refuses the meta."""
    ffi, lib = wire
    m = ffi.new("struct wire_meta *")
    if lib.wire_get_meta(ffi.new("uint8_t[]", meta), len(meta), cap, chunk, total, m) != 0:
        return -1, 0
    return m.nseg, m.data_len


def encode(wire, segments: list[tuple[int, int, int]], data_len: int, app: bytes) -> bytes:
    """A meta as the engine's sender encodes it (wire_put_meta, wire_put_meta_segment)."""
    ffi, lib = wire
    meta_len = lib.wire_meta_len(len(segments), len(app))
    out, app_buf = ffi.new("uint8_t[]", meta_len), ffi.new("uint8_t[]", app or b"\0")
    lib.wire_put_meta(out, ffi.new("struct wire_meta *", (meta_len, len(segments), data_len, len(app), app_buf)))
    for i, entry in enumerate(segments):
        lib.wire_put_meta_segment(out, i, ffi.new("struct wire_segment *", entry))
    return bytes(ffi.buffer(out, meta_len))


def decode(wire, meta: bytes, cap: int, chunk: int, total: int = 0):
    """(segments, data length, app blob) as wire_get_meta and wire_get_meta_segment give them, or None."""
    ffi, lib = wire
    buf, m = ffi.new("uint8_t[]", meta or b"\0"), ffi.new("struct wire_meta *")
    if lib.wire_get_meta(buf, len(meta), cap, chunk, total, m) != 0:
        return None
    seg, segments = ffi.new("struct wire_segment *"), []
    for i in range(m.nseg):
        assert lib.wire_get_meta_segment(buf, m, i, seg) == 0
        segments.append((seg.off, seg.len, seg.need))
    assert lib.wire_get_meta_segment(buf, m, m.nseg, seg) == -1  # no segment past the count
    return segments, m.data_len, bytes(ffi.buffer(m.app, m.app_len))


def laid_out(arrays: list[tuple[int, int, float]]) -> tuple[list[tuple[int, int, int]], int]:
    """Segments as a sender places them (each 8-byte aligned after the one before, gaps allowed), and the data length."""
    segments, end = [], 0
    for gap, length, fraction in arrays:
        off = (end + 7) // 8 * 8 + 8 * gap
        segments.append((off, length, int(length * fraction)))
        end = off + length
    return segments, end


u64 = st.one_of(st.integers(0, 4096), st.integers(0, 2**64 - 1), st.sampled_from([2**63, 2**64 - 8, 2**32]))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(u64, u64, u64), max_size=4), u64, st.binary(max_size=40), st.integers(0, 64),
       st.integers(1, 8192), st.integers(1, 4096), st.sampled_from([0, 1]))
def test_the_segment_table_decoder_accepts_only_tables_that_fit_the_message(wire, segments, data_len, app, pad,
                                                                               chunk, nchunks, known_total):
    meta = table(segments, data_len, app)
    meta += bytes(pad // 8 * 8)  # room to spare (a valid meta_len longer than its content)
    meta = struct.pack("<I", len(meta)) + meta[4:]
    cap = chunk * nchunks
    if len(meta) > cap:
        return
    total = (len(meta) + data_len) % 2**64 if known_total else 0
    nseg, got_len = parse(wire, meta, cap, chunk, total)
    if nseg < 0:
        return
    assert nseg == len(segments) and got_len == data_len
    assert len(meta) + data_len <= cap and len(meta) + data_len > cap - chunk
    prev = 0
    for off, length, need in segments:
        assert off % 8 == 0 and off >= prev and off + length <= data_len and need <= length
        prev = off + length


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 300), st.floats(0, 1)), max_size=5),
       st.binary(max_size=60), st.integers(64, 2048))
def test_every_table_a_sender_lays_out_is_accepted(wire, arrays, app, chunk):
    segments, end = laid_out(arrays)
    meta = table(segments, end, app)
    chunk = chunk // 8 * 8
    nchunks = -(-(len(meta) + end) // chunk)
    assert parse(wire, meta, nchunks * chunk, chunk, len(meta) + end) == (len(segments), end)


@pytest.mark.parametrize("change", ["misaligned", "overlapping", "past the end", "needs more than it holds",
                                    "app past the meta", "count past the meta", "length not the meta's"])
def test_crafted_segment_tables_are_refused(wire, change):
    segments, data_len, app = [(0, 16, 16), (16, 8, 0)], 24, b"[]"
    meta_len = None
    if change == "misaligned":
        segments[1] = (20, 4, 0)
    elif change == "overlapping":
        segments[1] = (8, 8, 0)
    elif change == "past the end":
        segments[1] = (16, 9, 0)
    elif change == "needs more than it holds":
        segments[1] = (16, 8, 9)
    meta = table(segments, data_len, app, meta_len)
    if change == "app past the meta":
        meta = meta[:16] + struct.pack("<I", len(meta)) + meta[20:]
    elif change == "count past the meta":
        meta = meta[:4] + struct.pack("<I", 1000) + meta[8:]
    elif change == "length not the meta's":
        meta = struct.pack("<I", len(meta) + 8) + meta[4:]
    cap = len(meta) + data_len
    assert parse(wire, table([(0, 16, 16), (16, 8, 0)], data_len, app), cap, cap)[0] == 2  # the unchanged one
    assert parse(wire, meta, cap, cap)[0] == -1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 300), st.floats(0, 1)), max_size=6),
       st.binary(max_size=60), st.integers(8, 256))
def test_the_meta_encoder_writes_the_wire_layout_and_the_decoder_gives_it_back(wire, arrays, app, chunk8):
    segments, data_len = laid_out(arrays)
    meta = encode(wire, segments, data_len, app)
    assert meta == table(segments, data_len, app)  # the bytes on the wire are those of the format
    chunk = chunk8 * 8
    cap = -(-(len(meta) + data_len) // chunk) * chunk
    assert decode(wire, meta, cap, chunk, len(meta) + data_len) == (segments, data_len, app)
    assert decode(wire, meta, cap, chunk) == (segments, data_len, app)  # the end not arrived yet


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 300), st.floats(0, 1)), min_size=1, max_size=6),
       st.binary(max_size=60), st.data())
def test_a_meta_cut_short_is_refused(wire, arrays, app, data):
    segments, data_len = laid_out(arrays)
    meta = encode(wire, segments, data_len, app)
    cut = data.draw(st.integers(0, len(meta) - 1))
    cap = len(meta) + data_len
    # as it came (its own length says more than there is), and with its length field made to agree
    assert decode(wire, meta[:cut], cap, cap) is None
    if cut >= 24:
        assert decode(wire, struct.pack("<I", cut) + meta[4:cut], cap, cap) is None


def test_a_meta_too_large_for_the_header_or_the_message_is_refused(wire):
    ffi, lib = wire
    assert lib.wire_meta_len(0, META_MAX - 24) == META_MAX  # the largest the header carries
    assert lib.wire_meta_len(0, META_MAX - 23) == 0
    assert lib.wire_meta_len((META_MAX - 24) // 24 + 1, 0) == 0
    assert lib.wire_meta_len(2**32 - 1, 2**32 - 1) == 0  # no overflow into a small length
    segments, data_len, app = [(0, 16, 16), (16, 8, 0)], 24, b"[]"
    meta = encode(wire, segments, data_len, app)
    cap = len(meta) + data_len
    assert decode(wire, meta, cap, cap) == (segments, data_len, app)
    assert decode(wire, meta, len(meta) - 8, len(meta) - 8) is None  # a meta longer than the message
    assert decode(wire, meta, cap - 8, cap - 8) is None  # data past the message's chunks
    grown = meta[:8] + struct.pack("<Q", 2**64 - 8) + meta[16:]
    assert decode(wire, grown, cap, cap) is None  # a data length past anything
    many = meta[:4] + struct.pack("<I", 2**32 - 1) + meta[8:]
    assert decode(wire, many, cap, cap) is None  # a segment count past the meta
