"""Per-layer bounds meet the byte-weighted target and put the loss where it hurts least."""
import numpy as np
import pytest

from p2plearn.tolerance import Layer, LayerwisePolicy, NetworkState, TrainingState

LAYERS = [
    Layer("conv1.weight", 800, 3200, 0),
    Layer("conv1.bias", 32, 128, 0, "bias"),
    Layer("bn1.weight", 32, 128, 1, "norm"),
    Layer("conv2.weight", 20000, 80000, 2),
    Layer("fc.weight", 50000, 200000, 3),
    Layer("fc.bias", 10, 40, 3, "bias"),
]
NBYTES = np.array([layer.nbytes for layer in LAYERS], dtype=float)


def delivered(bounds):
    return float((NBYTES * (1 - np.asarray(bounds))).sum() / NBYTES.sum())


def norms(rms):
    """Layer update norms from per-element RMS values."""
    return [r * np.sqrt(layer.numel) for r, layer in zip(rms, LAYERS)]


@pytest.mark.parametrize("target", [0.01, 0.05, 0.15])
@pytest.mark.parametrize("rms", [[1, 1, 1, 1, 1, 1], [5, 1, 1, 2, 0.1, 1], [0.1, 1, 1, 0.1, 9, 1], [1, 1, 1, 0, 1, 1]])
def test_target_met_bias_and_norm_exact_bounds_in_range(target, rms):
    policy = LayerwisePolicy(target_loss=target, max_bound=0.2, depth_weight=0.5)
    bounds, deadline = policy.bounds(0, LAYERS, NetworkState(), TrainingState(layer_update_norms=[norms(rms)]))
    assert abs(delivered(bounds) - (1 - target)) < 1e-6
    assert all(0 <= b <= 0.2 + 1e-12 for b in bounds)
    assert bounds[1] == bounds[2] == bounds[5] == 0.0
    assert deadline is None


def test_more_sensitive_layers_get_lower_bounds():
    policy = LayerwisePolicy(target_loss=0.05, depth_weight=0.0)
    training = TrainingState(layer_update_norms=[norms([4, 1, 1, 2, 1, 1])])
    bounds = policy.bounds(0, LAYERS, NetworkState(), training)[0]
    assert bounds[0] < bounds[3] < bounds[4]


def test_depth_protects_input_side_layers_at_equal_updates():
    bounds = LayerwisePolicy(target_loss=0.05, depth_weight=1.0).bounds(0, LAYERS, NetworkState(), TrainingState())[0]
    assert bounds[0] < bounds[3] < bounds[4]
    flat = LayerwisePolicy(target_loss=0.05, depth_weight=0.0).bounds(0, LAYERS, NetworkState(), TrainingState())[0]
    assert flat[0] == pytest.approx(flat[3]) and flat[3] == pytest.approx(flat[4])


def test_norms_are_averaged_over_the_window():
    policy = LayerwisePolicy(target_loss=0.05, depth_weight=0.0, window=2)
    spike = TrainingState(layer_update_norms=[norms([1] * 6), norms([1] * 6), norms([1, 1, 1, 1, 9, 1])])
    one = TrainingState(layer_update_norms=[norms([1, 1, 1, 1, 5, 1])])
    assert policy.bounds(0, LAYERS, NetworkState(), spike)[0] == pytest.approx(
        policy.bounds(0, LAYERS, NetworkState(), one)[0])


def test_zero_target_is_exact_and_infeasible_target_is_a_clear_error():
    assert LayerwisePolicy(target_loss=0.0).bounds(0, LAYERS, NetworkState(), TrainingState())[0] == [0.0] * 6
    with pytest.raises(ValueError, match="max_bound"):
        LayerwisePolicy(target_loss=0.3, max_bound=0.2).bounds(0, LAYERS, NetworkState(), TrainingState())
    with pytest.raises(ValueError, match="one norm per layer"):
        LayerwisePolicy().bounds(0, LAYERS, NetworkState(), TrainingState(layer_update_norms=[[1.0]]))


@pytest.mark.parametrize("kwargs", [dict(target_loss=1.0), dict(max_bound=-0.1), dict(depth_weight=-1),
                                    dict(window=0), dict(deadline_s=0)])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        LayerwisePolicy(**kwargs)
