"""The descriptor a message carries (dtype and shape of each array) comes from the network: whatever
a key holder puts there, `decode_descriptor` either gives a layout numpy can build over the message's
bytes or refuses it, and `Channel.recv` hands such a message over without arrays (as one whose
layout never arrived), counts it, and goes on."""
from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from p2plearn.transport.arrays import NUMERIC_DTYPES, decode_descriptor
from tests.transport.craft import DATA, datagram, message_chunks

KEY, JOB = bytes(range(32)), "descriptors"


def builds(layout, seg_lens) -> bool:
    """What Channel._wrap does with a layout: typed views over exactly the segments' bytes."""
    for (dtype, shape), nbytes in zip(layout, seg_lens):
        np.frombuffer(bytearray(nbytes), dtype=np.uint8).view(dtype).reshape(shape)
    return True


edges = st.sampled_from([0, 2**31, 2**32, 2**62, 2**63, 2**64])
dims = st.one_of(st.integers(0, 8), st.integers(-2, 2**65), edges, st.floats(allow_nan=True), st.booleans(), st.none(),
                 st.text(max_size=3))
shapes = st.one_of(st.lists(st.one_of(st.integers(0, 4), edges), max_size=4), st.lists(dims, max_size=34))
not_numeric = st.sampled_from(["O", "V8", "<M8", "(2,)<f4", "f4,i4", "S4"])
names = st.one_of(st.sampled_from(sorted(NUMERIC_DTYPES)), not_numeric,
                  st.text(max_size=8), st.integers(), st.lists(st.integers(), max_size=2))
items = st.one_of(st.tuples(names, shapes).map(list),
                  st.lists(st.one_of(names, dims), max_size=3), st.dictionaries(st.text(max_size=2), dims, max_size=2))
seg_lens = st.sampled_from([0, 0, 1, 4, 8, 12, 16, 64])


@settings(max_examples=400, deadline=None)
@given(st.lists(items, max_size=3), st.data())
def test_any_descriptor_is_a_layout_numpy_builds_or_refused(descriptor, data):
    lens = data.draw(st.one_of(st.lists(seg_lens, min_size=len(descriptor), max_size=len(descriptor)),
                               st.lists(seg_lens, max_size=3)))
    layout = decode_descriptor(json.dumps(descriptor).encode(), lens)
    assert layout is None or (len(layout) == len(lens) and builds(layout, lens))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(NUMERIC_DTYPES)), st.lists(st.one_of(st.integers(0, 4), edges),
                                                                           max_size=4)), min_size=1, max_size=3))
def test_a_descriptor_whose_sizes_add_up_is_a_layout_numpy_builds_or_refused(descriptor):
    """Numeric dtypes and integer shapes whose byte counts match the segments: what is left to
    refuse is a shape numpy cannot make (a zero with a huge dimension)."""
    lens = [math.prod(shape) * np.dtype(name).itemsize for name, shape in descriptor]
    assume(all(n <= 4096 for n in lens))
    layout = decode_descriptor(json.dumps(descriptor).encode(), lens)
    assert layout is None or builds(layout, lens)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode)), st.lists(seg_lens, max_size=3))
def test_any_bytes_are_a_layout_numpy_builds_or_refused(blob, lens):
    layout = decode_descriptor(blob, lens)
    assert layout is None or (len(layout) == len(lens) and builds(layout, lens))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(NUMERIC_DTYPES)), st.lists(st.integers(0, 5), max_size=4)),
                max_size=4))
def test_every_real_layout_decodes_to_itself(layout):
    arrays = [np.zeros(shape, dtype=name) for name, shape in layout]
    blob = json.dumps([[a.dtype.str, list(a.shape)] for a in arrays]).encode()
    assert decode_descriptor(blob, [a.nbytes for a in arrays]) == [(a.dtype, a.shape) for a in arrays]


# Each with the segment it travels with (bytes), all crafted by a key holder.
CRAFTED = [
    (b'[["<f4",[0,9223372036854775808]]]', b""),      # zero bytes, a dimension past numpy's index type
    (b'[["<f4",[0,4611686018427387904,4]]]', b""),    # zero bytes, nonzero dimensions overflowing numpy
    (b'[["<f8",[0,4294967296,4294967296]]]', b""),
    (b'[["<f4",[-1,-2]]]', bytes(8)),                 # negative dimensions whose product fits
    (b'[["<f4",[2.0]]]', bytes(8)),                   # a float dimension
    (b'[["<f4",[true,2]]]', bytes(8)),                # a bool dimension
    (b'[["O",[1]]]', bytes(8)),                       # objects: pointers from the network
    (b'[["(2,)<f4",[1]]]', bytes(8)),                 # a sub-array dtype
    (b'[[["<f4"],[2]]]', bytes(8)),                   # an unhashable dtype name
    (b'[{"<f4":[2]}]', bytes(8)),                     # an object where a pair belongs
    (b'[["<f4",[2],3]]', bytes(8)),                   # a triple
    (b'[["<f4",[3]]]', bytes(8)),                     # 12 bytes described, 8 sent
    (b'[' * 50_000 + b']' * 50_000, bytes(8)),         # nesting past the recursion limit
    (b'[["<f4",[' + b'9' * 5000 + b']]]', bytes(8)),  # an integer past int's digit limit
    (b'\xff\xfe', bytes(8)),                          # not UTF-8
    (b'null', bytes(8)),
]


def send_crafted(raw_peer, to, msg: int, descriptor: bytes, segment: bytes, chunk_size: int = 1024) -> None:
    chunks, meta_len = message_chunks([segment], descriptor, chunk_size)
    for k, body in enumerate(chunks):
        raw_peer.send(datagram(DATA, sender=5, msg=msg, chunk=k, nchunks=len(chunks), chunk_size=chunk_size,
                               meta_len=meta_len, body=body, job=JOB, key=KEY, to=to), to)


def test_crafted_descriptors_are_refused_counted_and_lose_nothing_else(channels, raw_peer):
    rx = channels(key=KEY, job_id=JOB)
    tx = channels(sender_id=1, key=KEY, job_id=JOB)
    for i, (descriptor, segment) in enumerate(CRAFTED):
        assert decode_descriptor(descriptor, [len(segment)]) is None, descriptor[:40]
        send_crafted(raw_peer, rx.address, 100 + i, descriptor, segment)
    for i in range(len(CRAFTED)):  # delivered in order, each without arrays
        got = rx.recv(timeout=30)
        assert got is not None and (got.sender, got.msg_id, got.arrays) == (5, 100 + i, None), got
    x = np.arange(1000, dtype=np.float32)
    handle = tx.send(7, [x], [rx.address])
    got = rx.recv(timeout=30)
    assert got is not None and (got.sender, got.msg_id) == (1, 7), got
    np.testing.assert_array_equal(got.arrays[0], x)
    assert handle.wait(10)[0].result == "exact"
    st = rx.stats()
    assert st["drop_bad_descriptor"] == len(CRAFTED) and st["messages_delivered"] == len(CRAFTED) + 1, st
    assert rx.recv(timeout=0.05) is None
