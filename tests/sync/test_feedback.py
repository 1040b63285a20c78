"""A partitioned aggregator's error feedback: its part's size, carried across layouts."""
import numpy as np
import pytest

from p2plearn.sync.exchange import PartExchange
from p2plearn.sync.compress import Compressor
from p2plearn.sync.feedback import PartFeedback


def test_a_new_cut_keeps_the_residual_of_what_stays_in_the_part():
    fb = PartFeedback()
    first = fb.residuals([(0, 100, 200), (1, 0, 50)])
    first[0][:] = np.arange(100, 200)
    first[1][:] = -1.0
    again = fb.residuals([(0, 100, 200), (1, 0, 50)])
    assert again[0] is first[0] and again[1] is first[1]  # the same layout: the same arrays, no copy
    moved = fb.residuals([(0, 150, 260)])  # array 0 cut anew; array 1 is another fragment's: kept
    assert moved[0].size == 110
    np.testing.assert_array_equal(moved[0][:50], np.arange(150, 200))  # stayed: carried
    assert not moved[0][50:].any()  # joined: starts at zero
    assert set(fb.pieces) == {(0, 150, 260), (1, 0, 50)}
    assert (fb.pieces[(1, 0, 50)] == -1.0).all()


def test_the_residuals_cost_a_part_not_the_model():
    flat = [np.zeros(1 << 20, np.float32), np.zeros(1 << 18, np.float32)]
    exchange = PartExchange(flat, Compressor("int4", [a.size for a in flat]), [a.copy() for a in flat])
    mine = [(0, 0, 1 << 16)]
    flat[0][:] = np.random.default_rng(0).standard_normal(flat[0].size)  # a change since the anchor
    exchange.reduce(mine, {}, resync=False)
    assert sum(r.size for r in exchange.gather_feedback.pieces.values()) == 1 << 16
    assert np.abs(exchange.gather_feedback.pieces[mine[0]]).max() > 0  # int4 left an error to carry


def test_the_state_round_trips_and_a_whole_array_state_loads_as_pieces():
    fb = PartFeedback()
    fb.residuals([(0, 64, 128)])[0][:] = 2.0
    restored = PartFeedback()
    restored.load_state_dict(fb.state_dict(), [256])
    np.testing.assert_array_equal(restored.residuals([(0, 64, 128)])[0], 2.0)
    legacy = PartFeedback()  # the format before: one residual of each whole array
    legacy.load_state_dict({"mode": "int4", "residuals": [np.arange(256, dtype=np.float32)]}, [256])
    np.testing.assert_array_equal(legacy.residuals([(0, 64, 128)])[0], np.arange(64, 128))
    with pytest.raises(ValueError, match="not a piece of this run's arrays"):
        PartFeedback().load_state_dict(fb.state_dict(), [100])
