"""Loss-tolerance policies: how much of each layer may be lost each round, and the round deadline.

`make_tolerance(name, **kwargs)` builds one by name; see each class for its arguments:
    fixed      FixedPolicy      one bound, fixed deadline (baseline; steady networks)
    adaptive   AdaptivePolicy   Early Close: bound and deadline follow measured loss and stragglers
    layerwise  LayerwisePolicy  per-layer bounds from update sensitivity at a total loss budget
    phase      PhasePolicy      per-training-phase bound, critical-regime guard, adaptive deadline
"""
from __future__ import annotations

from p2plearn.tolerance.adaptive import AdaptivePolicy
from p2plearn.tolerance.base import Layer, NetworkState, RoundRecord, TolerancePolicy, TrainingState
from p2plearn.tolerance.fixed import FixedPolicy
from p2plearn.tolerance.guard import CriticalRegimeGuard
from p2plearn.tolerance.layerwise import LayerwisePolicy
from p2plearn.tolerance.phase import PhasePolicy
from p2plearn.tolerance.timer import RoundTimer

POLICIES: dict[str, type[TolerancePolicy]] = {
    cls.name: cls for cls in (FixedPolicy, AdaptivePolicy, LayerwisePolicy, PhasePolicy)}


def make_tolerance(name: str, **kwargs) -> TolerancePolicy:
    """The policy called `name` (fixed, adaptive, layerwise, phase), built with `kwargs`."""
    if name not in POLICIES:
        raise ValueError(f"unknown tolerance policy {name!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[name](**kwargs)


__all__ = ["AdaptivePolicy", "CriticalRegimeGuard", "FixedPolicy", "Layer", "LayerwisePolicy", "NetworkState",
           "POLICIES", "PhasePolicy", "RoundRecord", "RoundTimer", "TolerancePolicy", "TrainingState",
           "make_tolerance"]
