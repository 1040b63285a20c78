"""Loss-tolerance policies: how much of each layer may be lost each round, and the round deadline."""
from p2plearn.tolerance.base import Layer, NetworkState, RoundRecord, TolerancePolicy, TrainingState

__all__ = ["Layer", "NetworkState", "RoundRecord", "TolerancePolicy", "TrainingState"]
