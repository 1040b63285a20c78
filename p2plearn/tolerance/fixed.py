"""The simplest policy: one loss bound for every layer and a fixed deadline."""
from __future__ import annotations

from p2plearn.tolerance.base import Layer, NetworkState, TolerancePolicy, TrainingState, check_bound


class FixedPolicy(TolerancePolicy):
    """Every layer may lose `loss_bound` of its bytes; each round closes at `deadline_s`.

    Use it as the baseline of experiments, and on networks whose loss is steady and known.

    Args (tuning):
        loss_bound: fraction of each layer that may be missing at a receiver, in [0, 1).
            0 = exact delivery (reliable transport). Set it a little above the network's steady
            loss rate so that the engine closes without waiting for retransmissions; training
            typically tolerates a few percent.
        deadline_s: seconds after which every receiver's send closes with whatever arrived;
            None = no deadline. A fixed deadline is a guess: set it to a few times a clean
            round's time, or use the `adaptive` policy, which measures it.
    """

    name = "fixed"

    def __init__(self, loss_bound: float = 0.0, deadline_s: float | None = None):
        check_bound("loss_bound", loss_bound)
        if deadline_s is not None and deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0 or None, got {deadline_s}")
        self.loss_bound = loss_bound
        self.deadline_s = deadline_s

    def bounds(self, round: int, layers: list[Layer], network: NetworkState,
               training: TrainingState) -> tuple[list[float], float | None]:
        return [self.loss_bound] * len(layers), self.deadline_s
