"""The value-bounded filter: error feedback is lossless, deferral flushes, messages shrink."""
import numpy as np
import pytest

from p2plearn.filter import DENSE, SPARSE, NoFilter, ValueFilter, decode, make_filter

SHAPES = [(64, 32), (32,), (32, 10), (10,)]


def heavy_tailed(rng, rounds):
    """Per-element scales that are log-normal (a few parameters always move a lot), random signs."""
    scales = [rng.lognormal(0.0, 1.5, size=s).astype(np.float32) * 1e-2 for s in SHAPES]
    return [[s * rng.standard_normal(s.shape).astype(np.float32) for s in scales] for _ in range(rounds)]


def roundtrip(f, r, ups):
    msg = f.encode(r, ups)
    return msg, f.decode(msg.arrays, SHAPES)


@pytest.mark.parametrize("granularity", ["per_element", "per_layer"])
def test_zero_threshold_is_identical_to_no_filter(granularity):
    rng = np.random.default_rng(0)
    f, none = ValueFilter(granularity, init=0.0), NoFilter()
    for r, ups in enumerate(heavy_tailed(rng, 3)):
        got, want = roundtrip(f, r, ups)[1], roundtrip(none, r, ups)[1]
        for g, w, u in zip(got, want, ups):
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(g, u)
    assert all(not r.any() for r in f.residuals)


@pytest.mark.parametrize("granularity", ["per_element", "per_layer"])
def test_sent_plus_residual_equals_the_sum_of_updates(granularity):
    rng = np.random.default_rng(1)
    f = ValueFilter(granularity, init_scale=3.0)
    rounds = heavy_tailed(rng, 8)
    sent = [np.zeros(s, dtype=np.float64) for s in SHAPES]
    for r, ups in enumerate(rounds):
        for acc, d in zip(sent, roundtrip(f, r, ups)[1]):
            acc += d
    for i in range(len(SHAPES)):
        total = np.sum([ups[i] for ups in rounds], axis=0, dtype=np.float64)
        np.testing.assert_allclose(sent[i] + f.residuals[i], total, rtol=0, atol=1e-6)
    assert any(r.any() for r in f.residuals)  # something was actually held back


def test_per_element_sends_large_elements_sparse_and_keeps_small_ones():
    f = ValueFilter("per_element", init=1.0)
    u = np.array([0.5, -2.0, 0.1, 0.0, 3.0, 0.2, -0.3, 0.0], dtype=np.float32)
    msg = f.encode(0, [u])
    assert msg.arrays[0].tolist() == [SPARSE] and msg.exact == [True, True, False]
    assert msg.arrays[1].dtype == np.int32 and msg.arrays[1].tolist() == [1, 4]
    assert msg.arrays[2].dtype == np.float32 and msg.arrays[2].tolist() == [-2.0, 3.0]
    np.testing.assert_array_equal(f.decode(msg.arrays, [(8,)])[0], [0, -2, 0, 0, 3, 0, 0, 0])
    np.testing.assert_array_equal(f.residuals[0], np.float32([0.5, 0, 0.1, 0, 0, 0.2, -0.3, 0]))
    # round 3: threshold 1 / 4 ** 0.5 = 0.5, residual + update crosses it
    msg = f.encode(3, [np.full(8, 0.6, dtype=np.float32)])
    assert f.threshold(3) == pytest.approx(0.5)
    assert msg.arrays[0].tolist() == [DENSE]           # most elements pass: dense is smaller
    # dense carries every element, the one under the threshold (0.3) too: receivers read each one's current
    # value, so keeping it back would only send it again later
    np.testing.assert_allclose(f.decode(msg.arrays, [(8,)])[0], [1.1, 0.6, 0.7, 0.6, 0.6, 0.8, 0.3, 0.6], rtol=1e-6)
    assert not f.residuals[0].any()


def test_per_layer_defers_accumulates_and_flushes_once_the_threshold_is_crossed():
    f = ValueFilter("per_layer", init=1.0, a=1e9)      # a huge a keeps the threshold at 1
    big, small = np.full(4, 2.0, dtype=np.float32), np.full(3, 0.3, dtype=np.float32)
    present = []
    for r in range(4):
        msg = f.encode(r, [big, small])
        present.append(msg.present)
        if r < 3:
            np.testing.assert_allclose(f.residuals[1], 0.3 * (r + 1))
    assert present == [[0], [0], [0], [0, 1]]          # 0.3, 0.6, 0.9 wait; 1.2 >= 1 flushes
    np.testing.assert_allclose(f.decode(msg.arrays, [(4,), (3,)])[1], 1.2, rtol=1e-6)
    assert not f.residuals[1].any()


def test_threshold_decays_as_init_over_round_to_the_one_over_a():
    f = ValueFilter(init=0.8, a=3)
    assert [f.threshold(r) for r in (0, 7)] == pytest.approx([0.8, 0.4])
    auto = ValueFilter(init_scale=2.0)
    auto.encode(0, [np.array([1.0, -3.0], dtype=np.float32)])
    assert auto.init == pytest.approx(4.0)             # 2 x mean |update| of the first round


@pytest.mark.parametrize("granularity", ["per_element", "per_layer"])
def test_messages_shrink_on_heavy_tailed_updates(granularity):
    f = make_filter("value", granularity=granularity, init_scale=2.0)
    for r, ups in enumerate(heavy_tailed(np.random.default_rng(2), 10)):
        f.encode(r, ups)
    stats = f.stats()
    assert stats["messages"] == 10 and stats["ratio"] > 1.1
    assert stats["dense_bytes"] == 10 * sum(np.prod(s) for s in SHAPES) * 4


def test_wire_bounds_keep_header_and_indices_exact():
    f = ValueFilter("per_element", init=1.0)
    msg = f.encode(0, [np.array([5.0, 0, 0, 0], dtype=np.float32), np.zeros(2, np.float32),
                       np.ones(2, np.float32) * 9])
    assert msg.layer_of == [-1, 0, 0, 2]
    assert msg.wire_bounds([0.1, 0.2, 0.3]) == [0.0, 0.0, 0.1, 0.3]


def test_decode_drops_sparse_layers_with_incomplete_indices_and_rejects_malformed_messages():
    f = ValueFilter("per_element", init=1.0)
    msg = f.encode(0, [np.array([5.0, 0, 0, 0], dtype=np.float32), np.ones(2, np.float32) * 9])
    shapes = [(4,), (2,)]
    out = decode(msg.arrays, shapes, complete=[True, False, True, True])
    assert not out[0].any() and out[1].tolist() == [9, 9]
    with pytest.raises(ValueError, match="header"):
        decode(msg.arrays, shapes, complete=[False, True, True, True])
    with pytest.raises(ValueError, match="announces"):
        decode(msg.arrays[:-1], shapes)
    bad_index = [msg.arrays[0], np.array([7], np.int32), msg.arrays[2], msg.arrays[3]]
    with pytest.raises(ValueError, match="out of range"):
        decode(bad_index, shapes)
    with pytest.raises(ValueError, match="unknown layer code"):
        decode([np.array([5, 1], np.int32), np.ones(2, np.float32)], shapes)
    with pytest.raises(ValueError, match="int32"):
        decode([np.array([1.0, 1.0])] + msg.arrays[1:], shapes)


def test_bad_arguments_give_clear_errors():
    with pytest.raises(ValueError, match="granularity"):
        ValueFilter("per_chunk")
    with pytest.raises(ValueError, match="a must be"):
        ValueFilter(a=0)
    with pytest.raises(ValueError, match="init must be"):
        ValueFilter(init=-1.0)
    with pytest.raises(ValueError, match="init_scale"):
        ValueFilter(init_scale=0)
    with pytest.raises(ValueError, match="unknown filter"):
        make_filter("topk")
    f = ValueFilter()
    with pytest.raises(ValueError, match="init is not known"):
        f.threshold(0)
    with pytest.raises(ValueError, match="round"):
        f.encode(-1, [np.ones(3)])
    with pytest.raises(ValueError, match="no updates"):
        f.encode(0, [])
    f.encode(0, [np.ones(3)])
    with pytest.raises(ValueError, match="shapes changed"):
        f.encode(1, [np.ones(4)])
