"""Early Close: the loss bound and the deadline follow the measured network."""
from __future__ import annotations

from p2plearn.tolerance.base import Layer, NetworkState, TolerancePolicy, TrainingState, check_bound
from p2plearn.tolerance.timer import RoundTimer


class AdaptivePolicy(TolerancePolicy):
    """Raises the tolerated loss after a bad round, tightens it back to exact delivery when clean.

    After each measured round (the newest `NetworkState.history` entry, read once):
      - bad round (loss_rate > loss_threshold, the deadline hit, or the timer flags a straggler):
        bound = min(max_bound, max(bound + step, loss_rate)), so the engine closes early instead
        of retransmitting through the burst;
      - clean round: bound = max(0, bound - relax), back towards exact delivery.
    The same bound applies to every layer. The deadline is `timer.deadline(network, bound)`: a
    slack over the robust (median) clean-round time, shortened by the bound, with a hard cap; it
    never grows with a straggler (see `RoundTimer`).

    Use it on shared or bursty networks (microbursts, incast, background traffic), where a
    fixed bound is either too tight (rounds stall) or too loose (loss when it is not needed).

    Args (tuning):
        max_bound: the most loss a round may tolerate, in [0, 1). Training usually absorbs
            5-10% of lost chunks; raise with care.
        step: how much a bad round raises the bound. Larger reacts faster to bursts.
        relax: how much a clean round lowers it. Keep it below `step` (raise fast, tighten
            slowly) so that an intermittent burst does not make the bound oscillate.
        loss_threshold: measured datagram loss above which a round counts as lossy. Set it
            above the network's background loss.
        timer: the shared round timer (deadline slack, straggler rule, hard cap); see RoundTimer.
    """

    name = "adaptive"
    STATE = ("bound", "_seen_round")

    def __init__(self, max_bound: float = 0.1, step: float = 0.02, relax: float = 0.01,
                 loss_threshold: float = 0.005, timer: RoundTimer | None = None):
        check_bound("max_bound", max_bound)
        if step <= 0 or relax <= 0:
            raise ValueError(f"step and relax must be > 0, got {step}, {relax}")
        if not 0 <= loss_threshold < 1:
            raise ValueError(f"loss_threshold must be in [0, 1), got {loss_threshold}")
        self.max_bound = max_bound
        self.step = step
        self.relax = relax
        self.loss_threshold = loss_threshold
        self.timer = timer or RoundTimer()
        self.bound = 0.0
        self._seen_round: int | None = None  # newest record already acted on: bounds() is idempotent

    def bounds(self, round: int, layers: list[Layer], network: NetworkState,
               training: TrainingState) -> tuple[list[float], float | None]:
        if network.history and network.history[-1].round != self._seen_round:
            last = network.history[-1]
            self._seen_round = last.round
            if last.loss_rate > self.loss_threshold or last.deadline_hit or self.timer.straggled(network):
                self.bound = min(self.max_bound, max(self.bound + self.step, last.loss_rate))
            else:
                self.bound = max(0.0, self.bound - self.relax)
        return [self.bound] * len(layers), self.timer.deadline(network, self.bound)
