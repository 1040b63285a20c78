"""--compress: values travel as fp16, bf16, int8 or int4 with error feedback and are merged in float32."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from p2plearn.options import Options, OptionsError
from p2plearn.sync import BSP
from p2plearn.sync.compress import BLOCK, BLOCK4, Compressor, pack_int4, unpack_int4
from p2plearn.sync.merge import decode, merge_parameter
from p2plearn.sync.partitioned import RESYNC_ROUNDS, Partitioned
from p2plearn.transport import Delivery, Reason
from tests.sync.test_rounds import job, run_threads  # noqa: F401 - job is the fixture

# the largest error of one value sent, relative to its own magnitude (fp16, bf16) or to its
# block's largest (int8, int4: half the scale)
ERROR = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "int8": 0.5 / 127, "int4": 0.5 / 7}
BLOCKS = {"int8": BLOCK, "int4": BLOCK4}


def _sent(c: Compressor, x: np.ndarray) -> np.ndarray:
    """What a receiver reads of x, compressed by c (the round's message, through the merge)."""
    wire = c.encode([x], [(0, 0, x.size)])
    arrays = [a.copy() for a in wire]
    d = Delivery(0, 0, arrays, np.ones(1, dtype=bool), Reason.COMPLETE, ("127.0.0.1", 1), [1.0] * len(arrays))
    got = np.zeros(x.size, dtype=np.float32)
    merge_parameter(got, c.contributions(d, [x.size]))
    return 2 * got  # the mean of 0 and what was sent


@pytest.mark.parametrize("mode", ["fp16", "bf16", "int8", "int4"])
def test_one_round_errs_by_at_most_the_formats_rounding(mode):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(5001) * 0.05).astype(np.float32)  # odd, and not a whole number of blocks
    got = _sent(Compressor(mode, [x.size]), x)
    if mode in BLOCKS:
        block = BLOCKS[mode]
        peak = np.repeat(np.abs(np.pad(x, (0, -x.size % block))).reshape(-1, block).max(axis=1), block)[:x.size]
        assert (np.abs(got - x) <= ERROR[mode] * peak * 1.0001).all()
    else:
        smallest = 2.0 ** -25 if mode == "fp16" else 0.0  # half fp16's subnormal step
        assert (np.abs(got - x) <= np.maximum(ERROR[mode] * np.abs(x) * 1.0001, smallest)).all()
    assert np.abs(got - x).max() > 0, "nothing was rounded: the test would not see a missing feedback"


@pytest.mark.parametrize("mode", ["fp16", "bf16", "int8", "int4"])
def test_error_feedback_sends_what_rounding_took_in_later_rounds(mode):
    """The values sent over rounds add up to the true values' sum, less the last residual: a
    rounding error is sent later, not lost; without feedback the same error would repeat."""
    rng = np.random.default_rng(1)
    c = Compressor(mode, [3000])
    xs = [(rng.standard_normal(3000) * 0.05).astype(np.float32) for _ in range(20)]
    total = sum(_sent(c, x).astype(np.float64) for x in xs)
    np.testing.assert_allclose(total, sum(x.astype(np.float64) for x in xs) - c.residuals[0], atol=1e-5)
    # and what is carried stays within about one round's rounding (it is rounded again with the next value)
    one_round = np.abs(_sent(Compressor(mode, [3000]), xs[0]) - xs[0]).max()
    assert np.abs(c.residuals[0]).max() <= 1.0001 * max(one_round, np.abs(xs[-1] - _sent(Compressor(mode, [3000]),
                                                                                         xs[-1])).max()) * 2


def test_the_compressed_message_is_smaller():
    x = np.zeros(10_001, dtype=np.float32)
    modes = ("fp16", "bf16", "int8", "int4")
    sizes = {m: sum(a.nbytes for a in Compressor(m, [x.size]).encode([x], [(0, 0, x.size)])) for m in modes}
    assert sizes == {"fp16": 20_002, "bf16": 20_002, "int8": 10_001 + 4 * -(-10_001 // BLOCK),
                     "int4": 5_001 + 4 * -(-10_001 // BLOCK4)}
    assert {m: Compressor(m, [x.size]).wire_bytes([x.size]) for m in modes} == sizes


@pytest.mark.parametrize("mode", ["fp16", "int4"])
@pytest.mark.parametrize("receivers", [1, 3])
def test_parts_whose_sizes_move_between_rounds_reuse_the_same_arrays(mode, receivers):
    """Partitioned rounds cut their parts anew with each view of the links (a few percent either
    way), and a scatter encodes one part per aggregator: the encoder writes into the arrays of
    earlier rounds (two sets, one still behind the channel) instead of allocating fresh pages every
    round. Settled after each encode, a round's later parts let go of the earlier rounds' arrays:
    with 3 receivers, 4 of every 6 arrays were allocated anew each round."""
    rng = np.random.default_rng(5)
    n = 100_000
    compressor = Compressor(mode, [receivers * 2 * n])
    memory, in_flight = set(), []  # where the arrays handed out lie
    for rnd in range(40):
        if rnd == 2:
            allocated = compressor._reused.allocated
        sent = []
        for k in range(receivers):
            size = int(n * (1 + 0.06 * rng.random()))
            sent.append(compressor.encode([rng.standard_normal(size).astype(np.float32)],
                                          [(0, 2 * k * n, 2 * k * n + size)], decoded=[]))
            assert sent[-1][0].size == (-(-size // 2) if mode == "int4" else size)
        compressor.settle()  # the round's end
        if rnd >= 2:
            memory |= {a.__array_interface__["data"][0] for arrays in sent for a in arrays}
        in_flight = sent[-1]  # what the channel holds until the next send
    assert compressor._reused.allocated == allocated, "a round allocated arrays anew"
    assert len(memory) <= receivers * len(in_flight) + len(in_flight)  # one set a round, one more behind the channel


def test_int4_packs_two_codes_per_byte_low_nibble_first():
    q = np.array([-7, 7, 0, -1, 3], dtype=np.int8)
    packed = pack_int4(q)
    assert packed.tolist() == [1 | 15 << 4, 8 | 7 << 4, 11 | 8 << 4]  # each as q + 8; the odd one out padded
    np.testing.assert_array_equal(unpack_int4(packed, q.size), q)


def test_a_lost_int4_chunk_loses_both_elements_of_each_byte_and_a_lost_scale_its_block():
    """The message as the engine hands it over: the codes, then the scales at the next 8-byte
    boundary, in chunks of 8 bytes; what was lost reads as zeros. The merge takes exactly the
    elements whose byte and scale both arrived."""
    n = 4 * BLOCK4 + 1  # odd: 129 bytes of codes, 5 scales
    rng = np.random.default_rng(5)
    x = rng.standard_normal(n).astype(np.float32)
    c = Compressor("int4", [n])
    codes, scales = c.encode([x], [(0, 0, n)])
    sent = x - c.residuals[0]  # what the encoder says a receiver reads
    offsets = [0, 136]
    arrived = np.ones(-(-(offsets[1] + scales.nbytes) // 8), dtype=bool)
    arrived[[3, 16]] = False  # bytes 24-31 (elements 48-63) and 128 (element 256, alone in its byte)
    arrived[18] = False  # scales 2 and 3: elements 128-255
    element_arrived = arrived[np.arange(n) // 2 // 8] & arrived[(offsets[1] + 4 * (np.arange(n) // BLOCK4)) // 8]
    codes[~arrived[np.arange(codes.size) // 8]] = 0
    scales[~arrived[(offsets[1] + 4 * np.arange(scales.size)) // 8]] = 0
    d = Delivery(0, 0, [codes, scales], arrived, Reason.CLOSED, ("127.0.0.1", 1), [15 / 17, 2 / 3], chunk_size=8,
                 offsets=offsets)
    contributions = c.contributions(d, [n])
    assert contributions[0].mask.shape == (n,) and contributions[0].chunks is None  # per element, as merges read
    own = rng.standard_normal(n).astype(np.float32)
    want = np.where(element_arrived, (own.astype(np.float64) + sent) / 2, own)
    assert merge_parameter(own, contributions) == pytest.approx(element_arrived.mean())
    np.testing.assert_allclose(own, want, rtol=1e-6, atol=1e-7)
    decoded, usable = decode(contributions[0], n)  # what a partitioned gather copies, and where
    np.testing.assert_array_equal(usable, element_arrived)
    np.testing.assert_allclose(decoded[element_arrived], sent[element_arrived], rtol=1e-6)


def test_a_lost_scale_loses_its_blocks_and_nothing_else():
    c = Compressor("int8", [3 * BLOCK])
    x = np.ones(3 * BLOCK, dtype=np.float32)
    q, scales = c.encode([x], [(0, 0, x.size)])
    # chunks of 64 bytes: q fills chunks 0-11, the 12 bytes of scales chunk 12 (lost)
    arrived = np.array([True] * 12 + [False])
    d = Delivery(0, 0, [q, scales], arrived, Reason.CLOSED, ("127.0.0.1", 1), [1.0, 0.0], chunk_size=64,
                 offsets=[0, 3 * BLOCK])
    own = np.zeros(x.size, dtype=np.float32)
    assert merge_parameter(own, c.contributions(d, [x.size])) == 0.0
    np.testing.assert_array_equal(own, 0.0)


def test_messages_of_another_format_or_size_are_not_merged():
    x = np.ones(100, dtype=np.float32)
    wire = Compressor("fp16", [100]).encode([x], [(0, 0, 100)])
    d = Delivery(0, 0, wire, np.ones(1, dtype=bool), Reason.COMPLETE, ("127.0.0.1", 1), [1.0])
    assert Compressor("int8", [100]).contributions(d, [100]) is None
    assert Compressor("bf16", [100]).contributions(d, [100]) is None
    assert Compressor("fp16", [99]).contributions(d, [99]) is None
    assert Compressor("fp16", [100]).contributions(d, [100]) is not None


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_the_residuals_are_state_to_resume_from(mode):
    rng = np.random.default_rng(6)
    c = Compressor(mode, [10, 21])
    xs = [rng.standard_normal(10).astype(np.float32), rng.standard_normal(21).astype(np.float32)]
    c.encode(xs, [(0, 0, 10), (1, 0, 21)])
    d = Compressor(mode, [10, 21])
    d.load_state_dict(c.state_dict())
    assert all(np.array_equal(a, b) for a, b in zip(c.residuals, d.residuals))
    # the next round's message from the restored state is the one the original would have sent
    for a, b in zip(c.encode(xs, [(0, 0, 10), (1, 0, 21)]), d.encode(xs, [(0, 0, 10), (1, 0, 21)])):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="compress fp16"):
        Compressor(mode, [10, 21]).load_state_dict(Compressor("fp16", [10, 21]).state_dict())


def test_options_refuse_compression_with_the_value_filter():
    assert Options(compress="int8").compress == "int8"
    assert Options(compress="int4").compress == "int4"
    with pytest.raises(OptionsError, match="--compress"):
        Options(compress="fp16", filter="value")
    with pytest.raises(OptionsError, match="--compress"):
        Options(compress="fp4")


@pytest.mark.parametrize("mode", ["fp16", "int8", "int4"])
def test_a_compressed_round_among_real_engines_averages_what_was_sent(job, mode):  # noqa: F811
    peers = job(3, BSP, compress=mode)
    rng = np.random.default_rng(3)
    for p in peers:
        for a in p.params:
            a[...] = (rng.standard_normal(a.shape) * 0.1).astype(np.float32)
    start = [[a.copy() for a in p.params] for p in peers]
    sent = [[_sent(Compressor(mode, [a.size]), a.reshape(-1)).reshape(a.shape) for a in own] for own in start]
    run_threads(peers, 1)
    for i, p in enumerate(peers):
        for t, got in enumerate(p.params):
            want = (start[i][t].astype(np.float64) + sum(sent[j][t] for j in range(3) if j != i)) / 3
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    model = sum(a.nbytes for a in peers[0].params)
    assert peers[0].sync.network.expected_bytes <= {"fp16": 0.5, "int8": 0.27, "int4": 0.15}[mode] * model


# Per format: the largest rounding error relative to the largest value (a block's, for int8 and int4),
# and the bytes per float32 byte.
ROUNDING = {"fp16": 2.0 ** -11, "int8": 1 / 254, "int4": 1 / 14}
BYTES = {"fp16": 0.5, "int8": (1 + 4 / 256) / 4, "int4": (0.5 + 4 / 64) / 4}


RESYNC_MODE = {"fp16": "fp16", "int8": "int8", "int4": "int8"}


def _random_models(peers, seed, scale=0.1):
    rng = np.random.default_rng(seed)
    for p in peers:
        for a in p.params:
            a[...] = (rng.standard_normal(a.shape) * scale).astype(np.float32)


@pytest.mark.parametrize("mode", ["fp16", "int8", "int4"])
def test_a_compressed_partitioned_first_round_is_the_average_of_values_to_the_formats_rounding(job, mode):  # noqa: F811
    """The first round of a fragment resyncs: values in both phases (int4's at 8 bits), whatever the
    anchors (here every peer's initial model differs from the one it then holds)."""
    peers = job(4, Partitioned, compress=mode)
    _random_models(peers, 4)
    mean = [np.mean([p.params[t].astype(np.float64) for p in peers], axis=0) for t in range(2)]
    largest = max(float(np.abs(a).max()) for p in peers for a in p.params)
    results = []
    run_threads(peers, 1, after_step=results.append)
    for p in peers:
        for got, want, first in zip(p.params, mean, peers[0].params):
            # scatter and gather each round once: two roundings of values at most `largest` in magnitude
            np.testing.assert_allclose(got, want, atol=2 * largest * ROUNDING[RESYNC_MODE[mode]], rtol=0)
            np.testing.assert_array_equal(got, first)  # every peer the same model: the anchors agree
    model = sum(a.nbytes for a in peers[0].params)
    for rs in results:  # a ring all-reduce's bytes, compressed
        assert rs.bytes_sent == pytest.approx(BYTES[RESYNC_MODE[mode]] * 2 * 3 / 4 * model, rel=0.05)


@pytest.mark.parametrize("mode", ["fp16", "int8", "int4"])
def test_compressed_partitioned_rounds_send_the_change_and_err_by_its_rounding(job, mode):  # noqa: F811
    """After the first round every peer holds the same anchor: each round then sends each peer's
    change since it (and the aggregators their averaged change), so the error is the format's
    rounding of the changes (1e-3 here), not of the values (0.1), at the format's bytes."""
    peers = job(4, Partitioned, compress=mode)
    _random_models(peers, 5)
    run_threads(peers, 1)
    rng = {p.client.rank: np.random.default_rng(p.client.rank) for p in peers}
    step = 1e-3
    model = sum(a.nbytes for a in peers[0].params)
    for rnd in range(1, RESYNC_ROUNDS):
        for p in peers:
            for a in p.params:
                a += (rng[p.client.rank].standard_normal(a.shape) * step).astype(np.float32)
        mean = [np.mean([p.params[t].astype(np.float64) for p in peers], axis=0) for t in range(2)]
        results = []
        run_threads(peers, 1, after_step=results.append)
        for p in peers:
            for got, want, first in zip(p.params, mean, peers[0].params):
                # a round's scatter and gather roundings, and what error feedback still holds of the last
                # round's: each at most the rounding of a change about 4 steps large
                np.testing.assert_allclose(got, want, atol=4 * 4 * step * ROUNDING[mode], rtol=0)
                np.testing.assert_array_equal(got, first)
        for rs in results:
            assert rs.round == rnd and rs.bytes_sent == pytest.approx(BYTES[mode] * 2 * 3 / 4 * model, rel=0.05)


def test_a_resync_round_is_planned_at_the_bytes_it_carries(job):  # noqa: F811
    """int4's resync rounds carry int8 values: their planned time (the adaptive deadline's base) is
    the change rounds' times int8's bytes over int4's, not the same."""
    peers = job(2, Partitioned, compress="int4")
    planned = []
    for _ in range(2):  # round 0 resyncs, round 1 sends the change
        run_threads(peers, 1)
        planned.append(peers[0].sync.network.planned_time_s)
    sizes = [a.size for a in peers[0].params]
    ratio = Compressor("int8", None).wire_bytes(sizes) / Compressor("int4", None).wire_bytes(sizes)
    assert planned[1] > 0 and planned[0] == pytest.approx(ratio * planned[1], rel=1e-9)


def test_a_peer_whose_anchor_is_off_rejoins_the_consensus_at_the_next_resync_round(job):  # noqa: F811
    """Changes never carry the anchor: a peer that adopted a model of its own (a joiner's, or one that
    kept its own values where a gather piece was lost) stays off until a round exchanges values."""
    peers = job(4, Partitioned, compress="int4")
    _random_models(peers, 6)
    run_threads(peers, 2)
    off = peers[2]
    for a in off.params:
        a += 0.05
    off.sync.adopt(off.sync.clock)  # this model is its anchor now
    run_threads(peers, RESYNC_ROUNDS - 2)  # rounds 2 .. RESYNC_ROUNDS - 1: changes (none, here)
    others = [p for p in peers if p is not off]
    for t in range(2):
        assert all(np.array_equal(p.params[t], others[0].params[t]) for p in others)
        assert np.abs(off.params[t] - others[0].params[t]).min() > 0.04  # still its own
    mean = [np.mean([p.params[t].astype(np.float64) for p in peers], axis=0) for t in range(2)]
    largest = max(float(np.abs(a).max()) for p in peers for a in p.params)
    run_threads(peers, 1)  # round RESYNC_ROUNDS: values
    assert off.sync.clock == RESYNC_ROUNDS + 1
    for t in range(2):
        for p in peers:
            np.testing.assert_array_equal(p.params[t], peers[0].params[t])
            np.testing.assert_allclose(p.params[t], mean[t], atol=2 * largest * ROUNDING["int8"], rtol=0)


def _poison(wire: list[np.ndarray], mode: str, bad: float) -> None:
    """What a hostile key holder sends: int8 and int4 scales of `bad` (every one), fp16 and bf16
    values of `bad` at every seventh element."""
    if mode in BLOCKS:
        for scales in wire[len(wire) // 2:]:
            scales[...] = bad
        return
    for values in wire:  # bfloat16: the high half of float32's bits
        values[::7] = np.float16(bad) if mode == "fp16" else np.float32(bad).view(np.uint32) >> 16


@pytest.mark.parametrize("mode, bad", [(mode, bad) for mode in ("fp16", "bf16", "int8", "int4")
                                       for bad in (np.nan, np.inf, -np.inf)] + [("int8", 3e38), ("int4", 3e38)])
def test_a_members_nonfinite_values_are_refused_where_they_are_unless_kept(mode, bad):
    """What a receiver reads of a message (merge and decode) refuses a NaN or inf value, and the
    block of a scale that is not finite or reads a code past float32's range (3e38 x 7), as a lost
    chunk (its own value stays); the rest merges. keep_nonfinite reads them as they come."""
    n = 2 * BLOCK + 3
    rng = np.random.default_rng(9)
    x = rng.standard_normal(n).astype(np.float32)
    c = Compressor(mode, [n])
    wire = c.encode([x], [(0, 0, n)])
    sent = x - c.residuals[0]
    _poison(wire, mode, bad)
    refused = np.ones(n, bool) if mode in BLOCKS else np.arange(n) % 7 == 0
    d = Delivery(0, 0, wire, np.ones(1, dtype=bool), Reason.COMPLETE, ("127.0.0.1", 1), [1.0] * len(wire))
    start = rng.standard_normal(n).astype(np.float32)
    own = start.copy()
    contributions = c.contributions(d, [n])
    merge_parameter(own, contributions)
    np.testing.assert_allclose(own[~refused], (start[~refused] + sent[~refused].astype(np.float64)) / 2, rtol=1e-6)
    np.testing.assert_array_equal(own[refused], start[refused])
    assert contributions[0].nonfinite == refused.sum()
    decoded, usable = decode(contributions[0], n)  # a partitioned gather
    np.testing.assert_array_equal(usable, ~refused)
    assert np.isfinite(decoded).all() and contributions[0].nonfinite == refused.sum()
    kept = Compressor(mode, [n], keep_nonfinite=True).contributions(d, [n])
    own = start.copy()
    merge_parameter(own, kept)
    assert kept[0].nonfinite == 0 and not np.isfinite(own).all()


def test_the_option_to_keep_nonfinite_values():
    assert Options().keep_nonfinite is False  # refused by default
    assert Options(keep_nonfinite=True).keep_nonfinite is True
    assert Options.from_env({"P2PLEARN_KEEP_NONFINITE": "1"}).keep_nonfinite is True
    with pytest.raises(OptionsError, match="--keep-nonfinite"):
        Options.from_env({"P2PLEARN_KEEP_NONFINITE": "maybe"})


def _hostile(peer, mode: str, bad: float) -> None:
    """Every message the peer sends carries `bad` (see `_poison`), in each of its formats."""
    exchange = getattr(peer.sync, "exchange", None)  # partitioned rounds' gather and resync formats
    formats = (exchange.gather_format, exchange.resync_format) if exchange is not None else ()
    for fmt in {peer.sync.compressor, *formats} - {None}:
        def encode(*args, fmt=fmt, honest=fmt.encode, **kwargs):
            wire = honest(*args, **kwargs)
            _poison(wire, fmt.mode, bad)
            return wire
        fmt.encode = encode


@pytest.mark.parametrize("bad", [np.nan, np.inf, 3e38])
def test_a_member_sending_nonfinite_int4_scales_poisons_no_model(job, bad):  # noqa: F811
    """Partitioned int4 rounds (round 0 resyncs in int8, round 1 sends int4 changes) with a member whose
    every scale is `bad`: every part it sends is refused and counted, by the aggregators (its scatter)
    and by every peer (its gather); every model stays finite."""
    peers = job(4, Partitioned, compress="int4")
    _random_models(peers, 7)
    hostile = peers[3]
    _hostile(hostile, "int4", bad)
    refused = {p.client.rank: 0 for p in peers[:3]}
    for _ in range(2):
        run_threads(peers, 1)
        for p in peers[:3]:  # its part of the hostile's scatter, and the hostile's part of the gather
            slices = p.sync._layouts[0][1].slices  # the round's parts, by the view it planned with
            refused[p.client.rank] += sum(b - a for k in (p.client.rank, 3) for _, a, b in slices[k])
    for p in peers:
        assert all(np.isfinite(a).all() for a in p.params)
    for p in peers[:3]:
        assert p.sync.nonfinite == {3: refused[p.client.rank]}
    assert not hostile.sync.nonfinite


@pytest.mark.parametrize("mode", ["fp16", "bf16"])
def test_a_members_nan_values_in_bsp_rounds_poison_no_model_and_are_logged_once(job, mode, caplog):  # noqa: F811
    peers = job(3, BSP, compress=mode)
    _random_models(peers, 8)
    _hostile(peers[2], mode, np.nan)
    with caplog.at_level(logging.WARNING, logger="p2plearn.sync"):
        run_threads(peers, 2)
    poisoned = sum(-(-a.size // 7) for a in peers[0].params)  # every seventh element of each array
    for p in peers[:2]:
        assert all(np.isfinite(a).all() for a in p.params) and p.sync.nonfinite == {2: 2 * poisoned}
    lines = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert len(lines) == 2  # one per receiving peer, the first time only
    assert all(f"{poisoned} non-finite values from rank 2" in line for line in lines)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # the NaN models' next messages
def test_keep_nonfinite_lets_a_members_nan_scales_through(job):  # noqa: F811
    """--keep-nonfinite: merged as they come, as before (round 0 is a resync: int8 scales)."""
    peers = job(4, Partitioned, compress="int4", keep_nonfinite=True)
    _random_models(peers, 7)
    _hostile(peers[3], "int4", np.nan)
    run_threads(peers, 1)
    assert all(not np.isfinite(a).all() for p in peers[:3] for a in p.params) and not peers[0].sync.nonfinite
