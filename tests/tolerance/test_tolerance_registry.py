"""make_tolerance builds each policy by name; the fixed policy."""
import pytest

from p2plearn.tolerance import (AdaptivePolicy, FixedPolicy, Layer, LayerwisePolicy, NetworkState, PhasePolicy,
                                TrainingState, make_tolerance)

LAYERS = [Layer("w", 1000, 4000, 0), Layer("b", 10, 40, 0, "bias")]


@pytest.mark.parametrize("name, cls", [("fixed", FixedPolicy), ("adaptive", AdaptivePolicy),
                                       ("layerwise", LayerwisePolicy), ("phase", PhasePolicy)])
def test_registry_builds_every_policy_and_each_decides_a_valid_round(name, cls):
    policy = make_tolerance(name)
    assert isinstance(policy, cls) and policy.name == name
    bounds, deadline = policy.bounds(0, LAYERS, NetworkState(), TrainingState())
    assert len(bounds) == len(LAYERS) and all(0 <= b < 1 for b in bounds)
    assert deadline is None or deadline > 0


def test_unknown_name_and_bad_kwargs():
    with pytest.raises(ValueError, match="fixed, adaptive, layerwise, phase"):
        make_tolerance("early")
    with pytest.raises(TypeError):
        make_tolerance("fixed", bound=0.1)


def test_fixed_policy():
    policy = make_tolerance("fixed", loss_bound=0.05, deadline_s=2.0)
    assert policy.bounds(3, LAYERS, NetworkState(), TrainingState()) == ([0.05, 0.05], 2.0)
    for kwargs in (dict(loss_bound=1.0), dict(loss_bound=-0.1), dict(deadline_s=0.0)):
        with pytest.raises(ValueError):
            FixedPolicy(**kwargs)
