"""--compress: values travel as fp16, bf16 or int8 with error feedback and are merged in float32."""
from __future__ import annotations

import numpy as np
import pytest

from p2plearn.options import Options, OptionsError
from p2plearn.sync import BSP
from p2plearn.sync.compress import BLOCK, Compressor
from p2plearn.sync.merge import merge_parameter
from p2plearn.sync.partitioned import Partitioned
from p2plearn.transport import Delivery, Reason
from tests.sync.test_rounds import job, run_threads  # noqa: F401 - job is the fixture

# the largest error of one value sent, relative to its own magnitude (fp16, bf16) or to its
# block's largest (int8)
ERROR = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "int8": 0.5 / 127}


def _sent(c: Compressor, x: np.ndarray) -> np.ndarray:
    """What a receiver reads of x, compressed by c (the round's message, through the merge)."""
    wire = c.encode([x], [(0, 0, x.size)])
    arrays = [a.copy() for a in wire]
    d = Delivery(0, 0, arrays, np.ones(1, dtype=bool), Reason.COMPLETE, ("127.0.0.1", 1), [1.0] * len(arrays))
    got = np.zeros(x.size, dtype=np.float32)
    merge_parameter(got, c.contributions(d, [x.size]))
    return 2 * got  # the mean of 0 and what was sent


@pytest.mark.parametrize("mode", ["fp16", "bf16", "int8"])
def test_one_round_errs_by_at_most_the_formats_rounding(mode):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(5000) * 0.05).astype(np.float32)
    got = _sent(Compressor(mode, [x.size]), x)
    if mode == "int8":
        peak = np.repeat(np.abs(np.pad(x, (0, -x.size % BLOCK))).reshape(-1, BLOCK).max(axis=1), BLOCK)[:x.size]
        assert (np.abs(got - x) <= ERROR[mode] * peak * 1.0001).all()
    else:
        smallest = 2.0 ** -25 if mode == "fp16" else 0.0  # half fp16's subnormal step
        assert (np.abs(got - x) <= np.maximum(ERROR[mode] * np.abs(x) * 1.0001, smallest)).all()
    assert np.abs(got - x).max() > 0, "nothing was rounded: the test would not see a missing feedback"


@pytest.mark.parametrize("mode", ["fp16", "bf16", "int8"])
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
    x = np.zeros(10_000, dtype=np.float32)
    sizes = {m: sum(a.nbytes for a in Compressor(m, [x.size]).encode([x], [(0, 0, x.size)]))
             for m in ("fp16", "bf16", "int8")}
    assert sizes == {"fp16": 20_000, "bf16": 20_000, "int8": 10_000 + 4 * -(-10_000 // BLOCK)}


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


def test_the_residuals_are_state_to_resume_from():
    c = Compressor("int8", [10, 20])
    c.encode([np.full(10, 0.3, np.float32), np.full(20, 0.7, np.float32)], [(0, 0, 10), (1, 0, 20)])
    d = Compressor("int8", [10, 20])
    d.load_state_dict(c.state_dict())
    assert all(np.array_equal(a, b) for a, b in zip(c.residuals, d.residuals))
    with pytest.raises(ValueError, match="compress fp16"):
        Compressor("int8", [10, 20]).load_state_dict(Compressor("fp16", [10, 20]).state_dict())


def test_options_refuse_compression_with_the_value_filter():
    assert Options(compress="int8").compress == "int8"
    with pytest.raises(OptionsError, match="--compress"):
        Options(compress="fp16", filter="value")
    with pytest.raises(OptionsError, match="--compress"):
        Options(compress="fp4")


@pytest.mark.parametrize("mode", ["fp16", "int8"])
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
    assert peers[0].sync.network.expected_bytes <= (0.5 if mode == "fp16" else 0.27) * model


def test_a_compressed_partitioned_round_is_the_average_to_fp16_rounding(job):  # noqa: F811
    peers = job(4, Partitioned, compress="fp16")
    rng = np.random.default_rng(4)
    for p in peers:
        for a in p.params:
            a[...] = (rng.standard_normal(a.shape) * 0.1).astype(np.float32)
    mean = [np.mean([p.params[t].astype(np.float64) for p in peers], axis=0) for t in range(2)]
    results = []
    run_threads(peers, 1, after_step=results.append)
    for p in peers:
        for got, want in zip(p.params, mean):
            # scatter and gather each round once: two fp16 roundings of values below 0.5 in magnitude
            np.testing.assert_allclose(got, want, atol=2 * 0.5 * 2.0 ** -11, rtol=0)
    model = sum(a.nbytes for a in peers[0].params)
    for rs in results:  # half a ring all-reduce's bytes
        assert rs.bytes_sent == pytest.approx(0.5 * 2 * 3 / 4 * model, rel=0.05)
