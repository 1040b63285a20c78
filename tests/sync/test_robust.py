"""The robust merge (clipping, trimmed mean) against a numpy reference, with masks, formats, non-finite values."""
import logging

import numpy as np
import pytest

from p2plearn.compute import InvalidArgument, check, ffi, lib
from p2plearn.sync.compress import pack_int4
from p2plearn.sync.merge import Contribution, decode, merge_parameter
from p2plearn.sync.robust import EXCLUDE_AFTER, HISTORY, RobustMerge
from p2plearn.transport.delivery import ChunkMask

TILE = 1024


def reference_clip(own, values, usable, radius, history=()):
    """Centered clipping as compute.h states it, in float64: per tile, a sender's difference beyond
    radius x the median (history and this merge's lower median of RMS distances) x sqrt(m) scaled
    down to min(radius, 1) x the median x sqrt(m)."""
    out, medians = own.astype(np.float64), []
    for start in range(0, own.size, TILE):
        sl = slice(start, min(own.size, start + TILE))
        o = own[sl].astype(np.float64)
        diffs = [np.where(u[sl], v[sl].astype(np.float64) - o, 0.0) for v, u in zip(values, usable)]
        counts = [int(u[sl].sum()) for u in usable]
        rms = sorted(np.sqrt((d * d).sum() / m) for d, m in zip(diffs, counts) if m)
        now = rms[(len(rms) - 1) // 2] if rms else -1.0
        medians.append(now)
        pool = sorted([h[start // TILE] for h in history if h[start // TILE] >= 0] + ([now] if now >= 0 else []))
        base = pool[(len(pool) - 1) // 2] if pool else -1.0
        acc, cnt = np.zeros_like(o), np.ones_like(o)
        for d, m, u in zip(diffs, counts, usable):
            norm, typical = np.sqrt((d * d).sum()), base * np.sqrt(m)
            acc += d * (min(radius, 1.0) * typical / norm if m and norm > radius * typical else 1.0)
            cnt += u[sl]
        out[sl] = o + acc / cnt
    return out, np.array(medians)


def reference_trimmed(own, values, usable, trim=1):
    out = own.astype(np.float64)
    for e in range(own.size):
        xs = np.sort([own[e]] + [float(v[e]) for v, u in zip(values, usable) if u[e]])
        cut = min(trim, (len(xs) - 1) // 2)
        out[e] = xs[cut:len(xs) - cut].mean()
    return out


def _readings(contributions, n):
    """Each contribution's values and usable elements as the plain merge reads them (merge.c's decode)."""
    pairs = [decode(c, n) for c in contributions]
    return [v for v, _ in pairs], [u for _, u in pairs]


def _senders(rng, own, k, spread=0.1):
    return [(own + spread * rng.standard_normal(own.size)).astype(np.float32) for _ in range(k)]


def test_clip_matches_the_reference_with_chunk_and_element_masks():
    rng = np.random.default_rng(0)
    n = 3 * TILE + 300  # a last partial tile
    own = rng.standard_normal(n).astype(np.float32)
    values = _senders(rng, own, 4)
    values[3] = (own - 50.0 * (values[3] - own)).astype(np.float32)  # sign flip x 50
    contributions = [Contribution(values[0]),
                     Contribution(values[1], chunks=ChunkMask(rng.random(4 * n // 64 + 2) > 0.3, 24, 64)),
                     Contribution(values[2], mask=rng.random(n) > 0.5),
                     Contribution(values[3], chunks=ChunkMask(rng.random(4 * n // 64 + 2) > 0.2, 0, 64))]
    vals, usable = _readings(contributions, n)
    expected, _ = reference_clip(own, vals, usable, 2.0)
    merged = own.copy()
    fraction = RobustMerge("clip").merge_parameter("w", merged, contributions, [1, 2, 3, 4])
    np.testing.assert_allclose(merged, expected, rtol=1e-5, atol=1e-6)
    assert fraction == pytest.approx(np.mean([u.mean() for u in usable]))
    plain, honest = own.copy(), own.copy()
    merge_parameter(plain, contributions)
    merge_parameter(honest, contributions[:3])
    # the flipped sender moves the robust merge a little from the honest senders' average, the plain one far
    assert np.linalg.norm(merged - honest) < 0.1 * np.linalg.norm(plain - honest)


@pytest.mark.parametrize("radius", [0.5, 2.0, 4.0])
def test_a_clipped_sender_moves_the_receiver_no_further_than_a_typical_one(radius):
    """Past radius x the typical distance a sender's difference is scaled down to the typical distance
    (to radius x it for a radius under 1), not to the radius: a liar clipped counts as an honest peer's
    distance, one within the radius is kept as it is."""
    n = TILE
    own = np.zeros(n, np.float32)
    values = [np.full(n, d, np.float32) for d in (1.0, 2.0, 3.0, 1000.0)]  # typical (lower median): 2
    merged = own.copy()
    RobustMerge("clip", radius=radius).merge_parameter("w", merged, [Contribution(v) for v in values], [1, 2, 3, 4])
    counted = [d if d <= radius * 2.0 else min(radius, 1.0) * 2.0 for d in (1.0, 2.0, 3.0, 1000.0)]
    np.testing.assert_allclose(merged, sum(counted) / 5, rtol=1e-6)
    expected, _ = reference_clip(own, values, [np.ones(n, bool)] * 4, radius)
    np.testing.assert_allclose(merged, expected, rtol=1e-6)


def test_clip_radius_takes_the_history_of_earlier_merges():
    """A later merge's radius is the median over this tensor's last HISTORY merges' tile medians and its own."""
    rng = np.random.default_rng(1)
    n = 2 * TILE
    own = rng.standard_normal(n).astype(np.float32)
    robust, history = RobustMerge("clip", radius=1.5), []
    for spread in (0.1, 0.1, 0.1, 1.0):  # the last merge's senders all far: the history holds the radius down
        values = _senders(rng, own, 2, spread)
        merged = own.copy()
        robust.merge_parameter("w", merged, [Contribution(v) for v in values], [1, 2])
        expected, medians = reference_clip(own, values, [np.ones(n, bool)] * 2, 1.5, history)
        history.append(medians)
        np.testing.assert_allclose(merged, expected, rtol=1e-5, atol=1e-6)
    assert np.abs(merged - own).max() < 0.5  # unclipped, the mean of two senders 1.0 away moves ~2/3 of it
    assert len(robust._history["w"]) == min(HISTORY, 4)


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp16", "bf16"])
def test_clip_reads_the_compressed_formats(fmt):
    rng = np.random.default_rng(2)
    n = 2 * TILE + 77
    own = rng.standard_normal(n).astype(np.float32)
    contributions = []
    for i, v in enumerate(_senders(rng, own, 3)):
        if i == 2:
            v = own + 40 * (own - v)
        if fmt in ("int8", "int4"):
            block, top = (256, 127) if fmt == "int8" else (64, 7)
            padded = np.zeros(-(-n // block) * block, np.float32)
            padded[:n] = v
            scales = np.abs(padded.reshape(-1, block)).max(1) / top
            q = np.rint(padded.reshape(-1, block) / scales[:, None]).astype(np.int8).reshape(-1)[:n]
            contributions.append(Contribution(q if fmt == "int8" else pack_int4(q), scales=scales, block=block,
                                              chunks=ChunkMask(rng.random(n // 64 + 2) > 0.2, 8, 64), finite_only=True))
        else:
            bits = v.astype(np.float16) if fmt == "fp16" else (v.view(np.uint32) >> 16).astype(np.uint16)
            contributions.append(Contribution(bits, mask=rng.random(n) > 0.3, finite_only=True))
    vals, usable = _readings(contributions, n)
    expected, _ = reference_clip(own, vals, usable, 2.0)
    merged = own.copy()
    RobustMerge("clip").merge_parameter(0, merged, contributions, [1, 2, 3])
    np.testing.assert_allclose(merged, expected, rtol=1e-5, atol=1e-5)


def test_non_finite_values_are_refused_and_counted():
    rng = np.random.default_rng(3)
    n = TILE + 10
    own = rng.standard_normal(n).astype(np.float32)
    values = _senders(rng, own, 3)
    values[1][[0, 5, 1030]] = [np.nan, np.inf, -np.inf]
    scales = np.full(-(-n // 256), 0.01, np.float32)
    scales[1] = np.inf  # a whole int8 block refused
    q = rng.integers(-100, 100, n).astype(np.int8)
    contributions = [Contribution(values[0], finite_only=True), Contribution(values[1], finite_only=True),
                     Contribution(q, scales=scales, block=256, finite_only=True)]
    vals, usable = _readings(contributions, n)
    expected, _ = reference_clip(own, vals, usable, 2.0)
    merged = own.copy()
    RobustMerge("clip").merge_parameter(0, merged, contributions, [1, 2, 3])
    assert np.isfinite(merged).all()
    np.testing.assert_allclose(merged, expected, rtol=1e-5, atol=1e-6)
    assert [c.nonfinite for c in contributions] == [0, 3, 256]


@pytest.mark.parametrize("mode", ["clip", "trimmed"])
def test_non_finite_values_are_refused_even_uncompressed(mode):
    """A plain float32 contribution is not checked by the plain merge; the robust one refuses its NaN and inf."""
    rng = np.random.default_rng(8)
    own = rng.standard_normal(TILE).astype(np.float32)
    values = _senders(rng, own, 4)
    values[0][[3, 700]] = [np.nan, np.inf]
    contributions = [Contribution(v) for v in values]
    merged = own.copy()
    RobustMerge(mode).merge_parameter(0, merged, contributions, [1, 2, 3, 4])
    assert np.isfinite(merged).all()
    assert [c.nonfinite for c in contributions] == [2, 0, 0, 0]
    usable = [np.isfinite(v) for v in values]
    expected = reference_clip(own, values, usable, 2.0)[0] if mode == "clip" else reference_trimmed(own, values, usable)
    np.testing.assert_allclose(merged, expected, rtol=1e-5, atol=1e-6)


def test_trimmed_mean_matches_the_reference_and_trims_the_outlier():
    rng = np.random.default_rng(4)
    n = TILE + 200
    own = rng.standard_normal(n).astype(np.float32)
    values = _senders(rng, own, 5)
    values[4] = (own + 1000.0).astype(np.float32)
    contributions = [Contribution(v, mask=rng.random(n) > 0.2) for v in values[:4]] + [Contribution(values[4])]
    vals, usable = _readings(contributions, n)
    merged = own.copy()
    robust = RobustMerge("trimmed")
    robust.merge_parameter(0, merged, contributions, [1, 2, 3, 4, 5])
    np.testing.assert_allclose(merged, reference_trimmed(own, vals, usable), rtol=1e-5, atol=1e-6)
    values_there = 1 + np.sum(usable, axis=0)
    assert np.abs(merged - own)[values_there >= 3].max() < 1.0  # where one value can be trimmed at each end
    assert np.abs(merged - own)[values_there == 2].min() > 400  # own and the outlier only: nothing to trim
    assert robust.stats()["senders"][5]["clipped"] == 1


def test_trimmed_mean_of_whole_tiles_matches_the_reference():
    """Tiles every sender brought whole beside one a sender brought in part (each element cut by its
    own count), and a last tile of 203 elements: the values and each sender's share cut."""
    rng = np.random.default_rng(8)
    n = 2 * TILE + 203
    own = rng.standard_normal(n).astype(np.float32)
    values = _senders(rng, own, 6)
    values[5] = (own + 1000.0).astype(np.float32)
    lost = np.ones(n, bool)
    lost[TILE + 10:TILE + 20] = False  # the second tile only
    contributions = [Contribution(v) for v in values]
    contributions[2] = Contribution(values[2], mask=lost)
    vals, usable = _readings(contributions, n)
    merged = own.copy()
    robust = RobustMerge("trimmed")
    robust.merge_parameter(0, merged, contributions, [1, 2, 3, 4, 5, 6])
    np.testing.assert_allclose(merged, reference_trimmed(own, vals, usable), rtol=1e-5, atol=1e-6)
    # each sender's share cut: 1 - sqrt(kept / arrived) of its squared differences, kept within the cuts
    diffs = [np.where(u, v.astype(np.float64) - own, 0.0) for v, u in zip(vals, usable)]
    lo, hi = np.empty(n), np.empty(n)
    for e in range(n):
        xs = np.sort([0.0] + [d[e] for d, u in zip(diffs, usable) if u[e]])
        lo[e], hi[e] = xs[1], xs[-2]
    senders = robust.stats()["senders"]
    for s, (d, u) in enumerate(zip(diffs, usable), start=1):
        kept = u & (d >= lo) & (d <= hi)
        assert senders[s]["cut"] == pytest.approx(1 - np.sqrt((d[kept] ** 2).sum() / (d[u] ** 2).sum()), rel=1e-9)
    assert senders[6]["clipped"] == 1 and all(senders[s]["clipped"] == 0 for s in range(1, 6))


@pytest.mark.parametrize("trim", [1, 2])
def test_trimmed_mean_with_lost_values_cuts_each_element_by_its_own_count(trim, monkeypatch):
    """Chunks and elements lost at random, so that elements keep 2 to 8 values (own included) and
    cut min(trim, (m - 1) / 2) at each end: the values, and each sender's share cut and values trimmed."""
    monkeypatch.setattr("p2plearn.sync.robust.TRIM", trim)
    rng = np.random.default_rng(11 + trim)
    n = 3 * TILE + 77
    own = rng.standard_normal(n).astype(np.float32)
    values = _senders(rng, own, 7, spread=1.0)
    chunks = [rng.random(4 * n // 256 + 2) > 0.5 for _ in range(4)]
    masks = [rng.random(n) > 0.6 for _ in range(2)]
    for arrived in chunks:
        arrived[20] = False  # elements 1280-1343: only the whole sender's value beside own's
    for mask in masks:
        mask[1280:1344] = False
    contributions = [Contribution(v, chunks=ChunkMask(a, 0, 256)) for v, a in zip(values, chunks)]
    contributions += [Contribution(v, mask=m) for v, m in zip(values[4:6], masks)] + [Contribution(values[6])]
    vals, usable = _readings(contributions, n)
    merged = own.copy()
    robust = RobustMerge("trimmed")
    robust.merge_parameter(0, merged, contributions, list(range(1, 8)))
    np.testing.assert_allclose(merged, reference_trimmed(own, vals, usable, trim), rtol=1e-5, atol=1e-6)
    counts = 1 + np.sum(usable, axis=0)
    assert counts.min() == 2 and counts.max() == 8  # elements where nothing can be cut, and full ones
    assert {m: (counts == m).sum() > 0 for m in range(2, 9)} == {m: True for m in range(2, 9)}
    diffs = [np.where(u, v.astype(np.float64) - own, 0.0) for v, u in zip(vals, usable)]
    lo, hi = np.empty(n), np.empty(n)
    for e in range(n):
        xs = np.sort([0.0] + [d[e] for d, u in zip(diffs, usable) if u[e]])
        cut = min(trim, (len(xs) - 1) // 2)
        lo[e], hi[e] = xs[cut], xs[len(xs) - 1 - cut]
    senders = robust.stats()["senders"]
    for s, (d, u) in enumerate(zip(diffs, usable), start=1):
        kept = u & (d >= lo) & (d <= hi)
        assert senders[s]["cut"] == pytest.approx(1 - np.sqrt((d[kept] ** 2).sum() / (d[u] ** 2).sum()), rel=1e-9)


def test_trimmed_with_few_senders_clips():
    """Below 2 x TRIM + 2 senders a trimmed mean cannot outvote one: the merge clips."""
    rng = np.random.default_rng(5)
    own = rng.standard_normal(TILE).astype(np.float32)
    values = _senders(rng, own, 2)
    values[1] = (own + 1000.0).astype(np.float32)
    merged = own.copy()
    RobustMerge("trimmed").merge_parameter(0, merged, [Contribution(v) for v in values], [1, 2])
    expected, _ = reference_clip(own, values, [np.ones(TILE, bool)] * 2, 2.0)
    np.testing.assert_allclose(merged, expected, rtol=1e-5, atol=1e-6)


def test_float64_and_float16_targets():
    rng = np.random.default_rng(6)
    for dtype in (np.float64, np.float16):
        own = rng.standard_normal(TILE + 5).astype(dtype)
        values = [(own + 0.1 * rng.standard_normal(own.size)).astype(np.float32) for _ in range(2)]
        merged = own.copy()
        RobustMerge("clip").merge_parameter(0, merged, [Contribution(v) for v in values], [1, 2])
        expected, _ = reference_clip(own, values, [np.ones(own.size, bool)] * 2, 2.0)
        np.testing.assert_allclose(merged, expected.astype(dtype), rtol=1e-3 if dtype == np.float16 else 1e-6,
                                   atol=1e-3 if dtype == np.float16 else 1e-7)


def test_a_sender_clipped_in_most_merges_is_excluded_once(caplog):
    rng = np.random.default_rng(7)
    own = rng.standard_normal(TILE).astype(np.float32)
    robust = RobustMerge("clip", exclude=True)
    with caplog.at_level(logging.WARNING, logger="p2plearn.sync"):
        for _ in range(EXCLUDE_AFTER + 3):
            values = _senders(rng, own, 3, 0.01)
            values[2] = (own - 100 * (values[2] - own)).astype(np.float32)
            robust.merge_parameter(0, own.copy(), [Contribution(v) for v in values], [1, 2, 9])
    stats = robust.stats()
    assert stats["excluded"] == [9]
    assert stats["senders"][9] == {"merges": EXCLUDE_AFTER, "clipped": EXCLUDE_AFTER, "cut": pytest.approx(0.98, abs=0.02)}
    assert stats["senders"][1]["merges"] == EXCLUDE_AFTER + 3 and stats["senders"][1]["clipped"] == 0
    assert sum("rank 9" in r.getMessage() for r in caplog.records) == 1


def test_bad_contributions_are_refused_before_anything_changes():
    own = np.ones(TILE, np.float32)
    with pytest.raises(ValueError, match="elements"):
        RobustMerge("clip").merge_parameter(0, own, [Contribution(np.zeros(10, np.float32))], [1])
    with pytest.raises(ValueError, match="radius"):
        RobustMerge("clip", radius=0.0)
    with pytest.raises(ValueError, match="mode"):
        RobustMerge("median")
    np.testing.assert_array_equal(own, 1.0)


def test_c_refuses_a_contribution_past_its_chunks():
    own = np.ones(100, np.float32)
    bad = Contribution(np.zeros(100, np.float32), chunks=ChunkMask(np.ones(2, bool), 0, 64))  # 400 bytes, 128 covered
    with pytest.raises(ValueError):  # the Python check; the C one says the same (below)
        RobustMerge("clip").merge_parameter(0, own, [bad], [1])
    c = ffi.new("p2p_contribution *")
    buf = np.zeros(100, np.float32)
    c.values, c.values_bytes, c.dtype = ffi.from_buffer(buf), buf.nbytes, lib.P2P_F32
    mask = np.ones(2, np.uint8)
    c.chunk_arrived, c.nchunks, c.chunk_size = ffi.from_buffer(mask), 2, 64
    how = ffi.new("p2p_robust *")
    how.mode, how.multiplier = lib.P2P_ROBUST_CLIP, 2.0
    with pytest.raises(InvalidArgument, match="past its 2 chunks"):
        check(lib.p2p_robust_merge(ffi.from_buffer(own), lib.P2P_F32, 100, c, 1, how, ffi.NULL))
    np.testing.assert_array_equal(own, 1.0)
