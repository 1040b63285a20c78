"""Loss-tolerance policies: how much of each layer may be lost each round, and the round deadline.

`make_tolerance(name, **kwargs)` builds one by name (`policy_from_options` as the flags name it);
see each class for its arguments:
    fixed      FixedPolicy      one bound, fixed deadline (baseline; steady networks)
    adaptive   AdaptivePolicy   Early Close: bound and deadline follow measured loss and stragglers
    layerwise  LayerwisePolicy  per-layer bounds from update sensitivity at a total loss budget
    phase      PhasePolicy      per-training-phase bound, critical-regime guard, adaptive deadline
"""
from __future__ import annotations

from p2plearn.options import Options
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


def policy_from_options(options: Options) -> TolerancePolicy:
    """The policy ``--tolerance`` names; ``--loss-bound`` is its (maximum / target / middle-phase)
    bound, and the policy's own default when it is 0 (an adaptive policy capped at 0 is `fixed`);
    ``--deadline-ms`` the fixed and layerwise policies' deadline."""
    deadline = options.deadline_ms / 1000 if options.deadline_ms else None
    bound = options.loss_bound
    if options.tolerance == "fixed":
        return make_tolerance("fixed", loss_bound=bound, deadline_s=deadline)
    if options.tolerance == "adaptive":
        return make_tolerance("adaptive", **({"max_bound": bound} if bound else {}))
    if options.tolerance == "layerwise":
        return make_tolerance("layerwise", deadline_s=deadline, **({"target_loss": bound} if bound else {}))
    return make_tolerance("phase", **({"middle_bound": bound} if bound else {}))


__all__ = ["AdaptivePolicy", "CriticalRegimeGuard", "FixedPolicy", "Layer", "LayerwisePolicy", "NetworkState",
           "POLICIES", "PhasePolicy", "RoundRecord", "RoundTimer", "TolerancePolicy", "TrainingState",
           "make_tolerance", "policy_from_options"]
