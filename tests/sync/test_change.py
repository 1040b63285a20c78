"""The size of a change, in C: each dtype a tensor has, read as numpy reads it."""
import numpy as np
import pytest

from p2plearn.compute import InvalidArgument
from p2plearn.sync.bfloat16 import BF16Array, store, values
from p2plearn.sync.change import change_norm


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, "bfloat16"])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 1001])
def test_the_norm_of_the_change_is_numpys(dtype, n):
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal(n) * 3, rng.standard_normal(n)
    if dtype == "bfloat16":
        now, before = np.zeros(n, np.uint16).view(BF16Array), np.zeros(n, np.uint16).view(BF16Array)
        store(now, a.astype(np.float32))
        store(before, b.astype(np.float32))
    else:
        now, before = a.astype(dtype), b.astype(dtype)
    expected = np.linalg.norm(values(now).astype(np.float64) - values(before).astype(np.float64))
    assert change_norm(now, before) == pytest.approx(expected, rel=1e-12, abs=0.0)


def test_a_subnormal_half_reads_as_its_value():
    now = np.array([np.float16(2.0 ** -24), np.float16(-(2.0 ** -20))])
    assert change_norm(now, np.zeros(2, np.float16)) == pytest.approx(float(np.hypot(2.0 ** -24, 2.0 ** -20)))


def test_tensors_that_do_not_match_are_refused():
    with pytest.raises(ValueError, match="3 float32 and 4 float32"):
        change_norm(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="float32 and 3 float64"):
        change_norm(np.zeros(3, np.float32), np.zeros(3, np.float64))
    with pytest.raises(InvalidArgument, match="change: tensors of dtype"):  # the C unit's own check
        change_norm(np.zeros(3, np.int8), np.zeros(3, np.int8))
    with pytest.raises(TypeError, match="int32"):
        change_norm(np.zeros(3, np.int32), np.zeros(3, np.int32))
