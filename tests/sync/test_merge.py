"""Mask-aware merging: averages what arrived, and a lost chunk never moves a parameter."""
import numpy as np

from p2plearn.sync import Contribution, merge_parameter


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
