"""NoFilter sends the dense update unchanged."""
import numpy as np

from p2plearn.filter import DENSE, NoFilter, make_filter


def test_no_filter_sends_dense_float32_and_decodes_to_the_same_values():
    f = make_filter("none")
    assert isinstance(f, NoFilter)
    ups = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1.5, -2.0])]
    msg = f.encode(0, ups)
    assert msg.arrays[0].tolist() == [DENSE, DENSE] and msg.present == [0, 1]
    assert np.shares_memory(msg.arrays[1], ups[0])    # float32 input travels without a copy
    out = f.decode(msg.arrays, [(2, 3), (2,)])
    np.testing.assert_array_equal(out[0], ups[0])
    assert out[1].dtype == np.float32 and out[1].tolist() == [1.5, -2.0]
    assert msg.dense_bytes == 32 and msg.sent_bytes == 32 + 8
    assert f.stats()["messages"] == 1
