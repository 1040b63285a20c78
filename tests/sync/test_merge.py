"""Mask-aware merging: averages what arrived, and a lost chunk never moves a parameter."""
import numpy as np
import pytest

from p2plearn.sync import Contribution, merge_parameter
from p2plearn.sync.bfloat16 import BF16Array, store
from p2plearn.sync.merge import decode, nonfinite, place
from p2plearn.compute import InvalidArgument, check, ffi, lib
from p2plearn.transport.delivery import ChunkMask


def test_complete_contributions_average():
    own = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    merge_parameter(own, [Contribution(np.array([3.0, 4.0, 5.0], dtype=np.float32)),
                          Contribution(np.array([5.0, 6.0, 7.0], dtype=np.float32))])
    np.testing.assert_allclose(own, [3.0, 4.0, 5.0])


def test_missing_elements_do_not_count():
    own = np.full((2, 3), 10.0, dtype=np.float32)
    values = np.zeros((2, 3), dtype=np.float32)  # the engine leaves zeros where chunks were lost
    mask = np.array([[True, False, True], [False, False, True]])
    values[mask] = 20.0
    frac = merge_parameter(own, [Contribution(values, mask)])
    np.testing.assert_allclose(own[mask], 15.0)
    np.testing.assert_allclose(own[~mask], 10.0)  # not dragged towards the zeros
    assert frac == mask.mean()


def test_per_element_weights_from_several_masks():
    own = np.zeros(4, dtype=np.float32)
    a = Contribution(np.full(4, 3.0, np.float32), np.array([True, True, False, False]))
    b = Contribution(np.full(4, 6.0, np.float32), np.array([True, False, True, False]))
    merge_parameter(own, [a, b])
    np.testing.assert_allclose(own, [3.0, 1.5, 3.0, 0.0])


def test_no_contributions_leave_the_parameter_alone():
    own = np.arange(5, dtype=np.float32)
    assert merge_parameter(own, []) == 1.0
    np.testing.assert_array_equal(own, np.arange(5))


def _expected_mean(own: np.ndarray, values: list[np.ndarray], arrived: list[np.ndarray]) -> np.ndarray:
    total, count = own.astype(np.float64), np.ones(own.shape)
    for v, a in zip(values, arrived):
        total += np.where(a, v.astype(np.float64), 0.0)
        count += a
    return total / count


def test_chunk_masks_say_which_elements_arrived():
    """Element e of an array sits in chunk (first_byte + 4 e) // chunk_size of its message; a lost
    chunk takes every element it holds, also across the array's first and last partial chunks."""
    rng = np.random.default_rng(1)
    n, chunk_size = 1000, 64
    own = rng.standard_normal(n).astype(np.float32)
    contributions, values, arrived = [], [], []
    for first_byte in (0, 24, 1000):
        v = rng.standard_normal(n).astype(np.float32)
        nchunks = (first_byte + 4 * n + chunk_size - 1) // chunk_size
        chunk_arrived = rng.random(nchunks) < 0.7
        contributions.append(Contribution(v, chunks=ChunkMask(chunk_arrived, first_byte, chunk_size)))
        values.append(v)
        arrived.append(chunk_arrived[(first_byte + 4 * np.arange(n)) // chunk_size])
    expected = _expected_mean(own, values, arrived)
    fraction = merge_parameter(own, contributions)
    np.testing.assert_allclose(own, expected, rtol=1e-6)
    assert fraction == pytest.approx(np.mean(arrived))


def test_whole_blocks_and_partial_blocks_merge_bit_for_bit_as_the_reference():
    """A contribution that brings a whole block is added without per-element counts, the others
    with them (lost chunks, values checked one by one): both give exactly the float64 reference,
    whichever contributions take which path in which block."""
    rng = np.random.default_rng(7)
    n, chunk_size = 5 * 2048 + 17, 4096  # blocks of 2048 elements, chunks of 1024
    own = rng.standard_normal(n).astype(np.float32)
    contributions, values, arrived = [], [], []
    for i, first_byte in enumerate((0, 100, 8192)):
        v = rng.standard_normal(n).astype(np.float32)
        nchunks = (first_byte + 4 * n + chunk_size - 1) // chunk_size
        chunk_arrived = rng.random(nchunks) < (1.0 if i == 0 else 0.8)
        contributions.append(Contribution(v, chunks=ChunkMask(chunk_arrived, first_byte, chunk_size),
                                          finite_only=i == 2))
        values.append(v)
        arrived.append(chunk_arrived[(first_byte + 4 * np.arange(n)) // chunk_size])
    assert not all(a.all() for a in arrived[1:])  # some blocks take the per-element path
    expected = _expected_mean(own, values, arrived).astype(np.float32)
    merge_parameter(own, contributions)
    np.testing.assert_array_equal(own, expected)


def test_chunk_and_element_masks_together():
    own = np.zeros(8, dtype=np.float32)
    chunks = ChunkMask(np.array([True, False]), 0, 16)  # elements 0-3 in chunk 0, 4-7 in chunk 1
    element = np.array([True, False, True, True, True, True, True, True])
    merge_parameter(own, [Contribution(np.full(8, 4.0, np.float32), element, chunks)])
    np.testing.assert_array_equal(own, [2, 0, 2, 2, 0, 0, 0, 0])


def test_values_travel_in_their_own_dtype():
    """float16 and int8 (times its block's scale) values are read as numbers and merged into float32."""
    own = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    merge_parameter(own, [Contribution(np.array([3.0, 4.0, 5.0], dtype=np.float16)),
                          Contribution(np.array([10, -20, 30], dtype=np.int8), scales=np.array([0.5], np.float32))])
    np.testing.assert_allclose(own, [(1 + 3 + 5) / 3, (2 + 4 - 10) / 3, (3 + 5 + 15) / 3], rtol=1e-6)


def test_float16_parameters_round_to_nearest_even():
    """Every float16 bit pattern survives a merge with itself (NaN stays NaN), and float32 means
    are rounded to float16 as numpy rounds them."""
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    own = every.copy()
    merge_parameter(own, [Contribution(every.copy())])
    finite = ~np.isnan(every)
    np.testing.assert_array_equal(own.view(np.uint16)[finite], every.view(np.uint16)[finite])
    assert np.isnan(own[~finite]).all()
    rng = np.random.default_rng(2)
    wide = (rng.standard_normal(200_000) * 10.0 ** rng.integers(-9, 6, 200_000)).astype(np.float32)
    own = np.zeros(wide.size, dtype=np.float16)
    merge_parameter(own, [Contribution(2 * wide)])  # the mean (0 + 2w) / 2 is w, exactly
    with np.errstate(over="ignore"):  # the largest values become inf, as they must
        np.testing.assert_array_equal(own.view(np.uint16), wide.astype(np.float16).view(np.uint16))


def test_bfloat16_parameters_round_as_torch_does():
    rng = np.random.default_rng(3)
    wide = rng.standard_normal(10_000).astype(np.float32)
    expected = np.zeros(wide.size, dtype=np.uint16).view(BF16Array)
    store(expected, wide)
    own = np.zeros(wide.size, dtype=np.uint16).view(BF16Array)
    merge_parameter(own, [Contribution(2 * wide)])
    np.testing.assert_array_equal(np.asarray(own), np.asarray(expected))
    merge_parameter(own, [Contribution(np.asarray(own).copy())])  # bfloat16 bits, as received
    np.testing.assert_array_equal(np.asarray(own), np.asarray(expected))


def test_malformed_contributions_are_refused():
    own = np.zeros(100, dtype=np.float32)
    past_the_end = ChunkMask(np.ones(3, dtype=bool), 0, 64)  # 3 chunks hold 48 floats, not 100
    with pytest.raises(ValueError, match="reaching past"):
        merge_parameter(own, [Contribution(np.zeros(100, np.float32), chunks=past_the_end)])
    with pytest.raises(ValueError, match="elements"):
        merge_parameter(own, [Contribution(np.zeros(99, np.float32))])
    with pytest.raises(ValueError, match="scales"):
        merge_parameter(own, [Contribution(np.zeros(100, np.int8), scales=np.ones(3, np.float32), block=25)])
    with pytest.raises(TypeError, match="dtype"):
        merge_parameter(own, [Contribution(np.zeros(100, np.int32))])
    np.testing.assert_array_equal(own, 0)


def test_int8_blocks_have_their_own_scales():
    own = np.zeros(5, dtype=np.float32)
    q = np.array([2, 4, 2, 4, 2], dtype=np.int8)
    merge_parameter(own, [Contribution(q, scales=np.array([1.0, 10.0, 100.0], np.float32), block=2)])
    np.testing.assert_allclose(own, [1, 2, 10, 20, 100])


def _int4_reference(codes: np.ndarray, scales: np.ndarray, block: int) -> np.ndarray:
    """The values int4 codes (0..15, one per element) stand for, computed without the packing."""
    return (codes.astype(np.float64) - 8) * np.repeat(scales.astype(np.float64), block)[:codes.size]


def _pack(codes: np.ndarray) -> np.ndarray:
    """Codes two per byte, element 2i in the low nibble (written out here, not taken from compress.py)."""
    padded = np.append(codes, 8) if codes.size % 2 else codes
    return (padded[0::2] + 16 * padded[1::2]).astype(np.uint8)


def test_int4_merges_as_a_numpy_reference_with_lost_chunks():
    """A byte of int4 codes holds two elements: a lost chunk loses both of each of its bytes, also
    where the array starts or ends inside a chunk and where the count is odd."""
    rng = np.random.default_rng(4)
    n, block, chunk_size = 1001, 64, 16
    own = rng.standard_normal(n).astype(np.float32)
    contributions, values, arrived = [], [], []
    for first_byte in (0, 3, 1000):
        codes = rng.integers(1, 16, n)
        scales = rng.random(-(-n // block)).astype(np.float32)
        nchunks = (first_byte + -(-n // 2) + chunk_size - 1) // chunk_size
        chunk_arrived = rng.random(nchunks) < 0.7
        element = rng.random(n) < 0.9
        contributions.append(Contribution(_pack(codes), element, ChunkMask(chunk_arrived, first_byte, chunk_size),
                                          scales=scales, block=block))
        values.append(_int4_reference(codes, scales, block))
        arrived.append(chunk_arrived[(first_byte + np.arange(n) // 2) // chunk_size] & element)
    expected = _expected_mean(own, values, arrived)
    fraction = merge_parameter(own, contributions)
    np.testing.assert_allclose(own, expected, rtol=1e-6)
    assert fraction == pytest.approx(np.mean(arrived))


def test_int4_codes_cover_every_nibble():
    """All 256 bytes, both nibbles: code c reads as c - 8 times its block's scale."""
    codes = np.empty(512, dtype=np.int64)
    codes[0::2], codes[1::2] = np.arange(256) % 16, np.arange(256) // 16  # byte b: low b % 16, high b // 16
    own = np.zeros(512, dtype=np.float32)
    merge_parameter(own, [Contribution(_pack(codes), scales=np.array([2.0, 0.5], np.float32), block=256)])
    np.testing.assert_array_equal(own, _int4_reference(codes, np.array([2.0, 0.5]), 256) / 2)


def test_malformed_int4_contributions_are_refused():
    own = np.zeros(101, dtype=np.float32)  # 51 bytes of codes, 2 scales of 64
    with pytest.raises(ValueError, match="int4 pairs"):
        merge_parameter(own, [Contribution(np.zeros(50, np.uint8), scales=np.ones(2, np.float32), block=64)])
    with pytest.raises(ValueError, match="int4 pairs"):
        merge_parameter(own, [Contribution(np.zeros(101, np.uint8), scales=np.ones(2, np.float32), block=64)])
    with pytest.raises(ValueError, match="scales"):
        merge_parameter(own, [Contribution(np.zeros(51, np.uint8), scales=np.ones(1, np.float32), block=64)])
    with pytest.raises(ValueError, match="scales"):
        merge_parameter(own, [Contribution(np.zeros(51, np.uint8), block=64)])
    with pytest.raises(ValueError, match="reaching past"):  # 3 chunks of 16 hold 48 of the 51 bytes
        merge_parameter(own, [Contribution(np.zeros(51, np.uint8), scales=np.ones(2, np.float32), block=64,
                                           chunks=ChunkMask(np.ones(3, dtype=bool), 0, 16))])
    with pytest.raises(TypeError, match="uint8"):
        merge_parameter(np.zeros(4, np.uint8), [Contribution(np.zeros(2, np.uint8), scales=np.ones(1, np.float32))])
    np.testing.assert_array_equal(own, 0)


@pytest.mark.parametrize("values_bytes, nscales, block", [(50, 2, 64), (51, 1, 64), (51, 2, 0), (0, 2, 64)])
def test_the_c_merge_checks_the_lengths_itself(values_bytes, nscales, block):
    """Called with lengths that do not fit (bypassing the Python checks), the C merge refuses
    before it reads or writes anything."""
    own = np.zeros(101, dtype=np.float32)
    codes, scales = np.full(51, 0x99, np.uint8), np.ones(2, np.float32)
    s = ffi.new("p2p_contribution[]", 1)
    s[0].values, s[0].values_bytes, s[0].dtype = ffi.from_buffer(codes), values_bytes, lib.P2P_I4
    s[0].scales, s[0].nscales, s[0].block = ffi.from_buffer("float[]", scales), nscales, block
    with pytest.raises(InvalidArgument, match="merge"):
        check(lib.p2p_merge(ffi.from_buffer(own), lib.P2P_F32, own.size, s, 1, ffi.NULL, ffi.NULL))
    np.testing.assert_array_equal(own, 0)
    s[0].values_bytes, s[0].nscales, s[0].block = 51, 2, 64  # the same call, fitting, merges
    check(lib.p2p_merge(ffi.from_buffer(own), lib.P2P_F32, own.size, s, 1, ffi.NULL, ffi.NULL))
    np.testing.assert_array_equal(own, 0.5)  # code 9 = 1, times scale 1, averaged with 0


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _on_the_wire(x: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """x as it travels in `dtype` ("bf16": bfloat16 bits), and the float64 values a receiver reads."""
    if dtype == "bf16":
        bits = np.zeros(x.size, dtype=np.uint16).view(BF16Array)
        store(bits, x)
        wire = np.asarray(bits)
        return wire, (wire.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    wire = x.astype(dtype)
    return wire, wire.astype(np.float64)


@pytest.mark.parametrize("dtype", [np.float16, "bf16", np.float32])
def test_finite_only_refuses_nan_and_inf_values_where_they_are(dtype):
    """A member's NaN and inf count as not arrived, there only (under an element mask and a chunk
    mask alike): elsewhere the merge is the honest one; nonfinite counts what arrived and was
    refused (a NaN in a lost chunk did not arrive). Without finite_only they reach the model."""
    rng = np.random.default_rng(7)
    n, chunk_size = 3001, 64
    itemsize = 4 if dtype == np.float32 else 2
    start = rng.standard_normal(n).astype(np.float32)
    honest, honest_read = _on_the_wire(rng.standard_normal(n).astype(np.float32), dtype)
    hostile, read, bad = [], [], []
    for _ in range(2):
        x = rng.standard_normal(n).astype(np.float32)
        nonfinite = rng.random(n) < 0.1
        x[nonfinite] = rng.choice([np.nan, np.inf, -np.inf], int(nonfinite.sum()))
        wire, values = _on_the_wire(x, dtype)
        hostile.append(wire)
        read.append(values)
        bad.append(nonfinite)
    element = rng.random(n) < 0.9
    chunks = rng.random(-(-n * itemsize // chunk_size)) < 0.8
    in_chunk = chunks[itemsize * np.arange(n) // chunk_size]
    contributions = [Contribution(honest), Contribution(hostile[0], element, finite_only=True),
                     Contribution(hostile[1], chunks=ChunkMask(chunks, 0, chunk_size), finite_only=True)]
    arrived = [np.ones(n, bool), element & ~bad[0], in_chunk & ~bad[1]]
    expected = _expected_mean(start, [honest_read, np.nan_to_num(read[0]), np.nan_to_num(read[1])], arrived)
    own = start.copy()
    fraction = merge_parameter(own, contributions)
    np.testing.assert_allclose(own, expected, rtol=1e-6)
    assert fraction == pytest.approx(np.mean(arrived))
    assert [c.nonfinite for c in contributions] == [0, (element & bad[0]).sum(), (in_chunk & bad[1]).sum()]
    own = start.copy()
    merge_parameter(own, [Contribution(hostile[0])])  # finite_only off: as they come
    assert not np.isfinite(own[bad[0]]).any() and np.isfinite(own[~bad[0]]).all()


def _scaled_on_the_wire(codes: np.ndarray, packed: bool) -> np.ndarray:
    return _pack(codes) if packed else (codes - 128).astype(np.int8)


@pytest.mark.parametrize("packed", [False, True], ids=["int8", "int4"])
def test_a_scale_that_is_not_finite_or_overflows_float32_loses_its_block(packed):
    """A block whose scale is NaN, inf, or so large that a code would read past float32's largest
    (|scale| x 128 for int8, x 8 for int4) counts as not arrived, in the merge and in `decode`
    alike; the largest scale that fits is read as it is."""
    top, block = 8 if packed else 128, 64
    rng = np.random.default_rng(8)
    n = 7 * block + 5  # 8 blocks, the last one partial (and an odd count of int4 codes)
    codes = rng.integers(0, 16 if packed else 256, n)
    reference = codes - (8 if packed else 128)
    scales = rng.random(8).astype(np.float32)
    scales[1:6] = [np.nan, np.inf, -np.inf, 3e38, np.nextafter(np.float32(FLOAT32_MAX / top), np.float32(np.inf))]
    scales[6] = FLOAT32_MAX / top  # every code still finite: kept
    refused = np.repeat(np.arange(8) >= 1, block)[:n] & np.repeat(np.arange(8) <= 5, block)[:n]
    element = rng.random(n) < 0.9
    start = rng.standard_normal(n).astype(np.float32)
    honest = rng.standard_normal(n).astype(np.float32)
    hostile = Contribution(_scaled_on_the_wire(codes, packed), element, scales=scales, block=block, finite_only=True)
    with np.errstate(invalid="ignore"):  # code 0 times inf
        values = np.nan_to_num(reference * np.repeat(scales.astype(np.float64), block)[:n], posinf=0, neginf=0)
    expected = _expected_mean(start, [honest, values], [np.ones(n, bool), element & ~refused])
    own = start.copy()
    merge_parameter(own, [Contribution(honest), hostile])
    np.testing.assert_allclose(own, expected, rtol=1e-6)
    assert np.isfinite(own).all()
    assert hostile.nonfinite == (element & refused).sum()
    got, usable = decode(hostile, n)  # what a partitioned gather reads
    np.testing.assert_array_equal(usable, element & ~refused)
    np.testing.assert_array_equal(got[usable], values[usable].astype(np.float32))
    assert (got[~usable] == 0).all() and hostile.nonfinite == (element & refused).sum()


@pytest.mark.parametrize("fmt", ["float32", "float64", "float16", "bf16", "int8", "int4"])
def test_every_format_merges_and_decodes_bit_for_bit_as_the_reference(fmt):
    """Each format's whole runs (a block the contribution brings entire, read in a loop of its own)
    and its partial ones (lost chunks; one non-finite value in a finite_only block) give exactly the
    float64 reference: int8/int4 scale blocks of odd length, so runs start on either code of a
    byte, an odd element count, a message offset inside a chunk."""
    rng = np.random.default_rng(11)
    n, chunk_size, block = 3 * 2048 + 11, 512, 37
    own = rng.standard_normal(n).astype(np.float32)
    contributions, values, arrived = [], [], []
    for i, first_byte in enumerate((0, 100, 3)):
        if fmt in ("int8", "int4"):
            codes = rng.integers(0, 16, n) if fmt == "int4" else rng.integers(0, 256, n)
            scales = rng.random(-(-n // block)).astype(np.float32)
            wire = _scaled_on_the_wire(codes, fmt == "int4")
            read = (codes - (8 if fmt == "int4" else 128)) * np.repeat(scales.astype(np.float64), block)[:n]
            extra = {"scales": scales, "block": block}
        else:
            x = rng.standard_normal(n).astype(np.float32)
            x[rng.integers(0, 2048)] = np.nan  # in the first merge block only: the others stay whole
            wire, read = _on_the_wire(x, {"float32": np.float32, "float64": np.float64, "float16": np.float16,
                                          "bf16": "bf16"}[fmt])
            extra = {}
        value_bits = {"int4": 4, "int8": 8, "float16": 16, "bf16": 16, "float32": 32}.get(fmt, 64)
        nchunks = (first_byte + -(-n * value_bits // 8) + chunk_size - 1) // chunk_size
        chunk_arrived = rng.random(nchunks) < (1.0 if i == 0 else 0.7)
        in_chunk = chunk_arrived[(first_byte + np.arange(n) * value_bits // 8) // chunk_size]
        contributions.append(Contribution(wire, chunks=ChunkMask(chunk_arrived, first_byte, chunk_size),
                                          finite_only=True, **extra))
        values.append(np.nan_to_num(read))
        arrived.append(in_chunk & np.isfinite(read))
    expected = _expected_mean(own, values, arrived).astype(np.float32)
    merged = own.copy()
    merge_parameter(merged, contributions)
    np.testing.assert_array_equal(merged, expected)
    got, usable = decode(contributions[1], n)
    np.testing.assert_array_equal(usable, arrived[1])
    np.testing.assert_array_equal(got, np.where(arrived[1], values[1], 0).astype(np.float32))
    # placed: the same reads where they arrived, plus a base (an anchor) or over the own values
    base = rng.standard_normal(n).astype(np.float32)
    for with_base in (base, None):
        placed = own.copy()
        place(contributions[1], placed, with_base)
        want = got + with_base if with_base is not None else got
        np.testing.assert_array_equal(placed, np.where(arrived[1], want, own))
    placed = base.copy()
    place(contributions[1], placed, placed)  # the base may be the output itself
    np.testing.assert_array_equal(placed, np.where(arrived[1], base + got, base))


@pytest.mark.parametrize("values_bytes, nscales, block", [(50, 2, 64), (51, 1, 64), (51, 2, 0), (0, 2, 64)])
def test_the_c_decode_checks_the_lengths_itself(values_bytes, nscales, block):
    """p2p_decode refuses what p2p_merge refuses, before it writes anything."""
    codes, scales = np.full(51, 0x99, np.uint8), np.ones(2, np.float32)
    out, usable, refused = np.full(101, 7.0, np.float32), np.zeros(101, np.uint8), ffi.new("uint64_t *")
    s = ffi.new("p2p_contribution *")
    s.values, s.values_bytes, s.dtype = ffi.from_buffer(codes), values_bytes, lib.P2P_I4
    s.scales, s.nscales, s.block, s.finite_only = ffi.from_buffer("float[]", scales), nscales, block, 1
    with pytest.raises(InvalidArgument, match="merge"):
        check(lib.p2p_decode(s, 101, ffi.from_buffer("float[]", out), ffi.from_buffer(usable), refused))
    assert (out == 7.0).all() and not usable.any()
    with pytest.raises(InvalidArgument, match="decode"):
        check(lib.p2p_decode(ffi.NULL, 101, ffi.from_buffer("float[]", out), ffi.from_buffer(usable), refused))
    s.values_bytes, s.nscales, s.block = 51, 2, 64  # the same call, fitting, decodes
    with pytest.raises(InvalidArgument, match="decode"):
        check(lib.p2p_decode(s, 101, ffi.NULL, ffi.from_buffer(usable), refused))
    check(lib.p2p_decode(s, 101, ffi.from_buffer("float[]", out), ffi.from_buffer(usable), refused))
    assert (out == 1.0).all() and usable.all() and refused[0] == 0


def _contributions(fmt: str, own_size: int, rng: np.random.Generator, k: int) -> list[Contribution]:
    """k contributions in `fmt`, finite_only, each with its own lost chunks (the first none), a NaN
    value or an infinite scale in the first merge block, odd int8/int4 scale blocks; the last also
    an element mask."""
    out = []
    for i in range(k):
        first_byte, extra = (0, 100, 3)[i % 3], {}
        if fmt in ("int8", "int4"):
            codes = rng.integers(0, 16, own_size) if fmt == "int4" else rng.integers(0, 256, own_size)
            wire = _scaled_on_the_wire(codes, fmt == "int4")
            extra = {"scales": rng.random(-(-own_size // 37)).astype(np.float32), "block": 37}
            extra["scales"][rng.integers(0, 2048 // 37)] = np.inf  # a block refused
        else:
            x = rng.standard_normal(own_size).astype(np.float32)
            x[rng.integers(0, 2048)] = np.nan
            wire, _ = _on_the_wire(x, {"float32": np.float32, "float64": np.float64, "float16": np.float16,
                                       "bf16": "bf16"}[fmt])
        nchunks = (first_byte + wire.nbytes + 511) // 512
        chunks = ChunkMask(rng.random(nchunks) < (1.0 if i == 0 else 0.7), first_byte, 512)
        mask = rng.random(own_size) < 0.9 if i == k - 1 else None
        out.append(Contribution(wire, mask=mask, chunks=chunks, finite_only=True, **extra))
    return out


@pytest.mark.parametrize("own_dtype", ["float32", "bf16"])
@pytest.mark.parametrize("fmt", ["float32", "float64", "float16", "bf16", "int8", "int4"])
def test_a_merge_folded_as_senders_arrive_equals_the_merge_at_the_end(fmt, own_dtype):
    """MergeFold, the contributions added in the merge's order but split over calls as they might
    arrive (one at a time, in groups, all at the end, some blocks begun and others not), gives the
    bits, the arrived fraction and the refusals of one merge_parameter over them all."""
    from p2plearn.sync.merge import MergeFold
    from p2plearn.sync.reused import ReusedArrays

    rng = np.random.default_rng(5)
    n, k = 3 * 2048 + 11, 5
    base = rng.standard_normal(n).astype(np.float32)
    contributions = _contributions(fmt, n, rng, k)

    def own() -> np.ndarray:
        if own_dtype == "float32":
            return base.copy()
        bits = np.zeros(n, dtype=np.uint16).view(BF16Array)
        store(bits, base)
        return bits

    at_end = own()
    fraction = merge_parameter(at_end, contributions)
    refused = [c.nonfinite for c in contributions]
    assert sum(refused) > 0 and 0.5 < fraction < 1.0  # the case has losses and refusals to agree on
    scratch = ReusedArrays()
    for splits in ([], [1, 2, 3, 4], [2], [4], [1, 3], [0, 5]):
        folded = own()
        fold = MergeFold(folded, scratch)
        bounds = [0, *splits, k] if splits else [0, k]
        for a, b in zip(bounds[:-2], bounds[1:-1]):
            fold.add(contributions[a:b])
            np.testing.assert_array_equal(np.asarray(folded), np.asarray(own()))  # own is written at the end only
        got = fold.finish(contributions[bounds[-2]:])
        np.testing.assert_array_equal(np.asarray(folded).view(np.uint8), np.asarray(at_end).view(np.uint8))
        assert got == fraction and [c.nonfinite for c in contributions] == refused


def test_a_fold_touches_only_the_blocks_added_to():
    """Contributions of part of a tensor's blocks (the rest of their chunks lost) and none at all:
    the blocks no one brought keep their values, a fold with nothing added leaves the tensor alone."""
    from p2plearn.sync.merge import MergeFold

    n = 4 * 2048
    own = np.arange(n, dtype=np.float32)
    arrived = np.zeros(n * 4 // 2048, dtype=bool)
    arrived[: 2048 * 4 // 2048] = True  # the first block's chunks only
    c = Contribution(np.full(n, 10.0, dtype=np.float32), chunks=ChunkMask(arrived, 0, 2048))
    fold = MergeFold(own)
    fold.add([c])
    assert fold.finish() == pytest.approx(0.25)
    np.testing.assert_array_equal(own[:2048], (np.arange(2048, dtype=np.float64) + 10) / 2)
    np.testing.assert_array_equal(own[2048:], np.arange(2048, n, dtype=np.float32))
    untouched = own.copy()
    assert MergeFold(own).finish() == 1.0
    np.testing.assert_array_equal(own, untouched)


def test_the_c_fold_refuses_a_fold_without_arrays_or_in_a_bad_state():
    own = np.zeros(10, dtype=np.float32)
    state = np.full(1, 3, dtype=np.uint8)
    sums = [np.zeros(10), np.zeros(10), np.zeros(1)]
    fold = ffi.new("p2p_fold *")
    with pytest.raises(InvalidArgument, match="without its arrays"):
        check(lib.p2p_merge_fold(ffi.from_buffer(own), lib.P2P_F32, 10, fold, ffi.NULL, 0, 1, ffi.NULL, ffi.NULL))
    fold.sum, fold.count, fold.whole = (ffi.from_buffer("double[]", a) for a in sums)
    fold.state = ffi.from_buffer("uint8_t[]", state)
    with pytest.raises(InvalidArgument, match="state 3"):
        check(lib.p2p_merge_fold(ffi.from_buffer(own), lib.P2P_F32, 10, fold, ffi.NULL, 0, 1, ffi.NULL, ffi.NULL))


@pytest.mark.parametrize("mode", [None, "fp16", "int8", "int4"])
def test_a_part_merged_as_its_senders_arrive_equals_the_part_merged_at_the_end(mode):
    """A partitioned round's aggregator (PartReduce) offered its senders' contributions in any
    arrival order, folding what is due at any points between (an expected sender that never comes
    holds back the higher ranks), ends with the bits of `PartExchange.reduce` over them all at once:
    the part, what the gather sends and its error feedback; each format with lost chunks and refusals."""
    from p2plearn.sync.compress import Compressor
    from p2plearn.sync.exchange import PartExchange

    rng = np.random.default_rng(9)
    sizes = [5000, 3 * 2048 + 11]
    slices = [(0, 1000, 5000), (1, 0, sizes[1])]
    base = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    anchor = [b + rng.standard_normal(b.size).astype(np.float32) * 0.01 for b in base]
    fmt = {None: "float32", "fp16": "float16", "int8": "int8", "int4": "int4"}[mode]
    senders = [1, 3, 4, 6]
    per_piece = [_contributions(fmt, b - a, rng, len(senders)) for _, a, b in slices]
    inputs = {s: [piece[j] for piece in per_piece] for j, s in enumerate(senders)}
    if mode is None:  # where the order of the sums shows: 1e17 + 1 - 1e17 is 0 or 1 in double
        base[1][:64] = 0.0
        for s, x in ((3, 1e17), (4, 1.0), (6, -1e17)):
            c = inputs[s][1]
            c.values[:64], c.chunks.arrived[0] = x, True
            if c.mask is not None:
                c.mask[:64] = True

    def exchange() -> tuple[PartExchange, list[np.ndarray]]:
        flat = [b.copy() for b in base]
        compressor = Compressor(mode, sizes) if mode else None
        return PartExchange(flat, compressor, [a.copy() for a in anchor] if mode else None), flat

    at_end, flat_at_end = exchange()
    sent_at_end, fractions = at_end.reduce(slices, inputs)
    sent_at_end = [a.copy() for a in sent_at_end]
    for trial in range(6):
        arriving, flat = exchange()
        reduction = arriving.begin(slices, [*senders, 5])  # 5 never comes
        for s in rng.permutation(senders):
            assert reduction.offer(int(s), inputs[int(s)])
            if rng.random() < 0.6:
                reduction.fold_due()
        assert not reduction.offer(senders[0], inputs[senders[0]])  # a second message from one sender
        sent, got = reduction.finish()
        assert got == fractions and sorted(reduction.refused) == senders
        for a, b in zip(sent, sent_at_end):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
        for a, b in zip(flat, flat_at_end):
            np.testing.assert_array_equal(a, b)
        if mode:
            for a, b in zip(arriving.gather_feedback.residuals(slices), at_end.gather_feedback.residuals(slices)):
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fmt", ["float32", "float16", "int8", "int4"])
def test_ordered_folds_give_one_merge_in_their_order_whatever_the_arrival_order(fmt):
    """A BSP or SSP receiver's merge (`OrderedFolds`, keys (round, sender)): round 7's expected
    senders in rank order, then the others by round and sender (an unexpected sender, late messages
    of older rounds). Offered in any arrival order, folded early at any points between, it ends with
    the bits, fractions and refusals of one merge_parameter per target over every contribution in
    that order; a target nothing came for (another fragment's array) keeps its values."""
    from p2plearn.sync.merge import OrderedFolds
    from p2plearn.sync.reused import ReusedArrays

    rng = np.random.default_rng(13)
    sizes = [3 * 2048 + 11, 2048 + 700, 50]
    base = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    keys = [(7, 1), (7, 3), (7, 4), (7, 0), (6, 2), (5, 3)]
    order = [(7, 1), (7, 3), (7, 4), (5, 3), (6, 2), (7, 0)]
    per_target = [_contributions(fmt, n, rng, len(keys)) for n in sizes[:2]]
    offered = {k: [per_target[0][j], per_target[1][j], None] for j, k in enumerate(keys)}
    if fmt == "float32":  # where the order of the sums shows: 1e17 + 1 - 1e17 is 0 or 1 in double
        base[0][:64] = 0.0
        for k, x in (((7, 3), 1e17), ((7, 4), 1.0), ((6, 2), -1e17)):
            c = offered[k][0]
            c.values[:64], c.chunks.arrived[0] = x, True
            if c.mask is not None:
                c.mask[:64] = True

    at_end = [b.copy() for b in base]
    fractions = [merge_parameter(at_end[i], [offered[k][i] for k in order]) for i in range(2)]
    refused = {k: nonfinite(offered[k]) for k in keys}
    assert sum(refused.values()) > 0 and all(0.5 < f < 1.0 for f in fractions)
    scratch = ReusedArrays()
    for trial in range(8):
        got = [b.copy() for b in base]
        folds = OrderedFolds(got, [(7, s) for s in (1, 3, 4)], scratch)
        for j in rng.permutation(len(keys)):
            assert folds.offer(keys[j], offered[keys[j]])
            if rng.random() < 0.5:
                folds.fold_due()
                np.testing.assert_array_equal(got[0], base[0])  # written by finish only
        assert not folds.offer(keys[0], offered[keys[0]])  # a second message of a round from one sender
        assert folds.finish() == [*fractions, 1.0]
        for a, b in zip(got, at_end + [base[2]]):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
        assert folds.refused == refused and sorted(folds.keys) == sorted(keys)
