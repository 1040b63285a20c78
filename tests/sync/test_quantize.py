"""The C encoder (native/quantize.c, through `Compressor.encode`) against the numpy encoder it replaced,
kept here as the reference: bit for bit, over rounds of error feedback, every mode and dtype, NaN and
inf included; its arrays reused across rounds only once no one holds them; its lengths checked."""
from __future__ import annotations

import weakref

import numpy as np
import pytest

from p2plearn.compute import InvalidArgument, check, ffi, lib
from p2plearn.sync.bfloat16 import BF16Array, store, values
from p2plearn.sync.compress import BLOCK, BLOCK4, Compressor, pack_int4
from p2plearn.sync.merge import decode
from p2plearn.transport import Delivery, Reason

MODES = ("fp16", "bf16", "int8", "int4")
FP16_MAX = 65504.0


# ---- the numpy encoder that sync/compress.py had before quantize.c: the reference ----------------
def _reference_block_quantize(x: np.ndarray, block: int, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    blocks = np.zeros(-(-x.size // block) * block, dtype=np.float32)
    blocks[:x.size] = x
    blocks = blocks.reshape(-1, block)
    scale = np.abs(blocks).max(axis=1) / np.float32(top)
    scale[scale == 0] = 1.0
    q = np.rint(blocks / scale[:, None]).astype(np.int8)
    return q.reshape(-1)[:x.size], scale, (q * scale[:, None]).reshape(-1)[:x.size]


def _reference_quantize(mode: str, x: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    if mode == "fp16":
        half = np.clip(x, -FP16_MAX, FP16_MAX).astype(np.float16)
        return [half], half.astype(np.float32)
    if mode == "bf16":
        bits = np.zeros(x.size, dtype=np.uint16).view(BF16Array)
        store(bits, x)
        return [np.asarray(bits)], values(bits)
    if mode == "int8":
        q, scale, decoded = _reference_block_quantize(x, BLOCK, 127)
        return [q, scale], decoded
    q, scale, decoded = _reference_block_quantize(x, BLOCK4, 7)
    return [pack_int4(q), scale], decoded


def reference_encode(mode: str, residuals: list[np.ndarray] | None, pieces: list[np.ndarray],
                     at: list[tuple[int, int, int]], decoded: list[np.ndarray]) -> list[np.ndarray]:
    sent, scales = [], []
    with np.errstate(all="ignore"):
        for piece, (t, a, b) in zip(pieces, at):
            x = values(piece).reshape(-1).astype(np.float32)
            if residuals is not None:
                residual = residuals[t][a:b]
                x += residual
            wire, read = _reference_quantize(mode, x)
            if residuals is not None:
                np.subtract(x, read, out=residual)
            decoded.append(read)
            sent.append(wire[0])
            scales.extend(wire[1:])
    return sent + scales


# ---- helpers --------------------------------------------------------------------------------------
def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def assert_same(got: np.ndarray, want: np.ndarray, nan_bits: bool = True) -> None:
    """Equal bit for bit (nan_bits False: a NaN where the other has a NaN, whatever its bits)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    differ = _bits(got) != _bits(want)
    if not nan_bits and got.dtype.kind == "f":
        differ &= ~(np.isnan(got) & np.isnan(want))
    assert not differ.any(), (f"{differ.sum()} of {got.size} differ, first at {np.flatnonzero(differ)[:5]}: "
                              f"{_bits(got)[differ][:5]} against {_bits(want)[differ][:5]}")


def _as(x: np.ndarray, dtype: str) -> np.ndarray:
    """The float32 values x as a parameter of dtype (bf16: a BF16Array)."""
    if dtype == "bf16":
        bits = np.empty(x.size, np.uint16).view(BF16Array)
        store(bits, x)
        return bits
    with np.errstate(all="ignore"):
        return x.astype(dtype)


def _values(rng: np.random.Generator, n: int, kind: str) -> np.ndarray:
    x = (rng.standard_normal(n) * 0.05).astype(np.float32)
    if kind == "zeros":  # whole blocks of zeros (scale 1) among others, and zeros of either sign
        x[:300] = 0.0
        x[300:400] = -0.0
    elif kind == "large":  # past fp16's range, and past float32's from float64 (see _as)
        x[::7] *= 1e6
        x[::11] = rng.choice([70000.0, -65520.0, 65504.0, 3e38, -3e38], size=x[::11].size)
    elif kind == "tiny":  # blocks whose largest value is subnormal: scales that round badly, codes past 127
        x[:] = rng.integers(-90, 90, size=n) * np.float32(1.4e-45)
        x[::3] = x[::3] * 1e30
    elif kind == "nonfinite":
        x[::13] = np.nan
        x[5::17] = -np.nan
        x[9::29] = np.inf
        x[2::31] = -np.inf
    return x


SIZES = [1, 2, 63, 64, 65, 255, 257, 5001, 9000]


# ---- bit for bit --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bf16"])
@pytest.mark.parametrize("kind", ["normal", "zeros", "large", "tiny", "nonfinite"])
@pytest.mark.parametrize("feedback", [True, False])
def test_the_c_encoder_matches_the_numpy_one_bit_for_bit(mode, dtype, kind, feedback):
    """Codes, scales, reads and residuals, over rounds (the residuals carry each round into the
    next), several pieces of odd sizes per message, a final partial block."""
    rng = np.random.default_rng(hash((mode, dtype, kind, feedback)) % 2**32)
    sizes = [sum(SIZES), 70_000]
    at = [(0, a, a + n) for a, n in zip(np.cumsum([0] + SIZES[:-1]), SIZES)] + [(1, 100, 65_636), (1, 65_636, 65_637)]
    c = Compressor(mode, sizes if feedback else None)
    reference = [np.zeros(n, np.float32) for n in sizes] if feedback else None
    for rnd in range(3):
        pieces = [_as(_values(rng, b - a, kind), dtype) for _, a, b in at]
        got_read: list[np.ndarray] = []
        want_read: list[np.ndarray] = []
        got = c.encode(pieces, at, got_read)
        want = reference_encode(mode, reference, pieces, at, want_read)
        # a NaN added to a NaN residual (rounds after the first) takes either's bits in numpy, by its SIMD lane
        nan_bits = rnd == 0 or kind != "nonfinite"
        assert len(got) == len(want)
        for g, w in zip(got + got_read, want + want_read):
            assert_same(g, w, nan_bits)
        for g, w in zip(c.residuals or [], reference or []):
            assert_same(g, w, nan_bits)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["normal", "large", "tiny", "nonfinite"])
def test_a_change_made_in_the_encoders_pass_is_the_subtraction_numpy_makes(mode, kind):
    """Pieces encoded with their anchors (a partitioned scatter's changes) give the codes, reads and
    residuals of the numpy difference encoded, over rounds of error feedback."""
    rng = np.random.default_rng(hash((mode, kind)) % 2**32)
    at = [(0, a, a + n) for a, n in zip(np.cumsum([0] + SIZES[:-1]), SIZES)]
    fused, apart = Compressor(mode, [sum(SIZES)]), Compressor(mode, [sum(SIZES)])
    for rnd in range(3):
        pieces = [_values(rng, b - a, kind).astype(np.float32) for _, a, b in at]
        anchors = [_values(rng, b - a, kind).astype(np.float32) for _, a, b in at]
        got_read: list[np.ndarray] = []
        want_read: list[np.ndarray] = []
        got = fused.encode(pieces, at, got_read, anchors=anchors)
        want = apart.encode([p - a for p, a in zip(pieces, anchors)], at, want_read)
        for g, w in zip(got + got_read + fused.residuals, want + want_read + apart.residuals):
            assert_same(g, w, nan_bits=rnd == 0 or kind != "nonfinite")


@pytest.mark.parametrize("mode", MODES)
def test_a_nan_payload_is_kept_as_numpy_keeps_it(mode):
    """One NaN of its own bits per block (sign, payload, signalling): the codes carry the same bits
    as numpy's, and so do the reads of fp16 and bf16. An int8/int4 block's scale is NaN there as in
    numpy, whose max keeps the payload or not by where the NaN sits in its SIMD loop."""
    payloads = np.array([0x7F800001, 0xFF800001, 0x7FC00001, 0x7FA00000, 0xFFC12345], np.uint32).view(np.float32)
    x = np.linspace(-1, 1, 5 * BLOCK, dtype=np.float32)
    x[np.arange(5) * BLOCK + 17] = payloads
    got_read, want_read = [], []
    got = Compressor(mode, [x.size]).encode([x], [(0, 0, x.size)], got_read)
    want = reference_encode(mode, [np.zeros(x.size, np.float32)], [x], [(0, 0, x.size)], want_read)
    for g, w in zip(got + got_read, want + want_read):
        assert_same(g, w, nan_bits=mode in ("fp16", "bf16") or g.dtype != np.float32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("keep", [False, True])
def test_a_receiver_reads_the_c_encoders_nonfinite_values_as_it_read_numpys(mode, keep):
    """What keep_nonfinite changes on the receiving side is unchanged: the same values read, the same
    ones refused as not finite."""
    rng = np.random.default_rng(3)
    x = _values(rng, 3001, "nonfinite")
    x[1000:1100] = 1e38  # int8/int4 scales that read codes past float32's range
    c = Compressor(mode, [x.size], keep_nonfinite=keep)
    read = []
    for arrays in (c.encode([x], [(0, 0, x.size)]), reference_encode(mode, [np.zeros(x.size, np.float32)], [x],
                                                                        [(0, 0, x.size)], [])):
        arrays = [a.copy() for a in arrays]
        d = Delivery(0, 0, arrays, np.ones(1, bool), Reason.COMPLETE, ("127.0.0.1", 1), [1.0] * len(arrays))
        [contribution] = c.contributions(d, [x.size])
        got, usable = decode(contribution, x.size)
        read.append((got, usable, contribution.nonfinite))
    (got, usable, refused), (want, want_usable, want_refused) = read
    assert_same(got, want)
    np.testing.assert_array_equal(usable, want_usable)
    assert refused == want_refused and (refused == 0) == keep


# ---- arrays kept across rounds ------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_arrays_still_held_are_never_written_and_released_ones_are_reused(mode):
    rng = np.random.default_rng(4)
    sizes = [4000, 4000, 123]  # two pieces of one size: two arrays of each kind
    at = [(t, 0, n) for t, n in enumerate(sizes)]
    c = Compressor(mode, sizes)

    def encode() -> list[np.ndarray]:
        read: list[np.ndarray] = []
        arrays = c.encode([_values(rng, n, "normal") for n in sizes], at, read)
        return arrays + read

    held = encode()  # as a send in flight holds them
    frozen = [a.copy() for a in held]
    seen = [weakref.ref(a.base) for a in held]  # (what is handed out is a view of a kept array)
    for _ in range(3):
        newer = encode()
        seen += [weakref.ref(a.base) for a in newer]
        assert not {id(a.base) for a in held} & {id(a.base) for a in newer}  # none of the held ones handed out again
        for a, before in zip(held, frozen):
            assert_same(a, before)
    del newer
    again = encode()  # every array of it one handed out before (alive since: no other object has its id)
    assert all(any(r() is a.base for r in seen) for a in again), "a new array although released ones were there"
    assert len({id(a.base) for a in again}) == len(again)


def test_a_send_in_flight_keeps_its_arrays_and_rounds_alternate_between_two_sets():
    """A round's send is referenced (a channel's handle) until after the next round's encode: two
    sets of arrays alternate, and nothing more is allocated however many rounds run."""
    c = Compressor("int8", [5000])
    x = np.ones(5000, np.float32)
    in_flight = c.encode([x], [(0, 0, x.size)])
    rounds = [[weakref.ref(a.base) for a in in_flight]]
    for k in range(1, 7):
        in_flight = c.encode([x], [(0, 0, x.size)])  # while the last round's is still held
        rounds.append([weakref.ref(a.base) for a in in_flight])
        if k >= 2:
            assert all(r() is a.base for r, a in zip(rounds[k - 2], in_flight))


def test_the_pool_lets_go_of_what_a_round_did_not_need():
    """Arrays a caller held for many rounds are not all kept once released: after the next round,
    the pool holds one set, the one it handed out."""
    c = Compressor("int4", [3000])
    x = np.ones(3000, np.float32)

    def round_of_one_message(decoded: list[np.ndarray] | None) -> list[np.ndarray]:
        arrays = c.encode([x], [(0, 0, x.size)], decoded)
        c.settle()
        return arrays

    held = [round_of_one_message([]) for _ in range(5)]  # five sets, none reusable meanwhile
    refs = [weakref.ref(a.base) for arrays in held for a in arrays]
    del held
    last = round_of_one_message(None)
    assert sum(r() is not None for r in refs) == len(last) == 2  # the codes and scales reused; the rest freed


@pytest.mark.parametrize("mode", MODES)
def test_an_empty_piece_encodes_to_empty_arrays(mode):
    read: list[np.ndarray] = []
    arrays = Compressor(mode, [0, 5]).encode([np.zeros(0, np.float32)], [(0, 0, 0)], read)
    assert [a.size for a in arrays + read] == [0] * len(arrays + read)


# ---- lengths --------------------------------------------------------------------------------------
def _job(n: int, fmt: int = lib.P2P_I8, block: int = BLOCK, **short: int):
    """A job for n float32 values, every array of the right length but those `short` names shorter."""
    keep = {"values": np.zeros(n - short.get("values", 0), np.float32),
            "codes": np.zeros(n - short.get("codes", 0), np.int8),
            "scales": np.zeros(-(-n // max(block, 1)) - short.get("scales", 0), np.float32),
            "residual": np.zeros(n - short.get("residual", 0), np.float32),
            "decoded": np.zeros(n - short.get("decoded", 0), np.float32),
            "anchor": np.zeros(n - short.get("anchor", 0), np.float32)}
    job = ffi.new("p2p_quantize_job *")
    job.values, job.values_bytes, job.dtype = ffi.from_buffer(keep["values"]), keep["values"].nbytes, lib.P2P_F32
    job.format, job.codes, job.codes_bytes = fmt, ffi.from_buffer(keep["codes"]), keep["codes"].nbytes
    job.scales, job.nscales, job.block = ffi.from_buffer("float[]", keep["scales"]), keep["scales"].size, block
    job.residual, job.nresidual = ffi.from_buffer("float[]", keep["residual"]), keep["residual"].size
    job.decoded, job.ndecoded = ffi.from_buffer("float[]", keep["decoded"]), keep["decoded"].size
    job.anchor, job.nanchor = ffi.from_buffer("float[]", keep["anchor"]), keep["anchor"].size
    return job, keep


@pytest.mark.parametrize("short, message", [
    ({"values": 1}, "bytes of values"), ({"codes": 1}, "bytes for codes"), ({"scales": 1}, "scales"),
    ({"residual": 1}, "residuals"), ({"decoded": 1}, "decoded"), ({"anchor": 1}, "an anchor of 999 float32"),
])
def test_every_length_is_checked_before_anything_is_written(short, message):
    job, keep = _job(1000, **short)
    keep["residual"][:] = 5.0
    with pytest.raises(InvalidArgument, match=message):
        check(lib.p2p_quantize(job, 1000))
    assert (keep["residual"] == 5.0).all() and not keep["codes"].any()


def test_an_anchor_is_only_subtracted_from_float32_values():
    job, keep = _job(100)
    keep["values"] = np.zeros(100, np.float64)
    job.values, job.values_bytes, job.dtype = ffi.from_buffer(keep["values"]), 800, lib.P2P_F64
    with pytest.raises(InvalidArgument, match="an anchor of 100 float32 for 100 elements of dtype 1"):
        check(lib.p2p_quantize(job, 100))


@pytest.mark.parametrize("fmt, block, message", [(lib.P2P_I8, 0, "blocks of 0"), (lib.P2P_I4, 4096, "blocks of 4096"),
                                                 (lib.P2P_F32, BLOCK, "format"), (lib.P2P_I4 + 1, BLOCK, "format")])
def test_a_format_or_block_it_cannot_encode_is_refused(fmt, block, message):
    job, _ = _job(100, fmt, block)
    with pytest.raises(InvalidArgument, match=message):
        check(lib.p2p_quantize(job, 100))


def test_a_piece_and_its_residual_of_other_sizes_are_refused():
    c = Compressor("fp16", [10])
    with pytest.raises(ValueError, match="residual"):
        c.encode([np.zeros(12, np.float32)], [(0, 0, 10)])
