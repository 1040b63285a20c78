"""Training-phase aware bounds: tight while the model moves fast or converges, loose in between."""
from __future__ import annotations

from p2plearn.tolerance.base import Layer, NetworkState, TolerancePolicy, TrainingState, check_bound
from p2plearn.tolerance.guard import CriticalRegimeGuard
from p2plearn.tolerance.timer import RoundTimer

PHASES = ("beginning", "middle", "final")


class PhasePolicy(TolerancePolicy):
    """One bound per training phase; phases only move forward; a critical-regime guard forces
    exact delivery; the deadline is the adaptive one (`RoundTimer`), so bursts cannot stall a round.

    Phase tracking, from evaluation accuracy when the script reports it (`TrainingState.accuracies`,
    ideally the mean over peers), at each new evaluation with A = accuracy, D = its change:
        D > begin_change                     -> beginning
        A > min_accuracy and D < final_change -> final
        A > min_accuracy and D <= begin_change -> middle
    Without accuracies, from the training loss: every `loss_window` rounds, with S the
    exponentially smoothed loss (factor `smoothing`) and r = (S[t - loss_window] - S[t]) / |S[t - loss_window]|
    its relative decrease over the window:
        r > begin_change  -> beginning
        r < final_change  -> final (only from the middle, in place of the accuracy condition)
        otherwise         -> middle
    The candidate phase is taken only if it is later than the current one.

    Args (tuning):
        beginning_bound, middle_bound, final_bound: loss bound of every layer in each phase, in
            [0, 1). Early training and the final convergence are sensitive; the middle tolerates
            the most (default 0 / 0.1 / 0).
        begin_change, final_change: thresholds above (literature: 0.07 and 0.03 of accuracy
            per epoch). With the loss path they compare the relative loss decrease per window:
            scale them with `loss_window` (a longer window sees a larger decrease).
        min_accuracy: accuracy that must be reached before the middle or final phase (0.5).
        loss_window: rounds per loss-based phase decision (about an epoch).
        smoothing: EMA factor of the loss in [0, 1); higher is smoother (noisy minibatch losses).
        guard: the critical-regime guard (k=10, eta=0.5 by default); see CriticalRegimeGuard.
        timer: the shared round timer setting the deadline; see RoundTimer.
    """

    name = "phase"
    reads_update_norms = True  # (the critical-regime guard)
    STATE = ("phase", "_accuracies_seen", "_losses_seen", "_ema", "_window_start", "_in_window")

    def __init__(self, beginning_bound: float = 0.0, middle_bound: float = 0.1, final_bound: float = 0.0,
                 begin_change: float = 0.07, final_change: float = 0.03, min_accuracy: float = 0.5,
                 loss_window: int = 50, smoothing: float = 0.9, guard: CriticalRegimeGuard | None = None,
                 timer: RoundTimer | None = None):
        for name, value in (("beginning_bound", beginning_bound), ("middle_bound", middle_bound),
                            ("final_bound", final_bound)):
            check_bound(name, value)
        if not 0 <= final_change <= begin_change:
            raise ValueError(f"need 0 <= final_change <= begin_change, got {final_change}, {begin_change}")
        if loss_window < 1:
            raise ValueError(f"loss_window must be >= 1, got {loss_window}")
        if not 0 <= smoothing < 1:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.phase_bounds = {"beginning": beginning_bound, "middle": middle_bound, "final": final_bound}
        self.begin_change = begin_change
        self.final_change = final_change
        self.min_accuracy = min_accuracy
        self.loss_window = loss_window
        self.smoothing = smoothing
        self.guard = guard or CriticalRegimeGuard()
        self.timer = timer or RoundTimer()
        self.phase = PHASES[0]
        self._accuracies_seen = 1  # the first evaluation has no change D yet
        self._losses_seen = 0
        self._ema: float | None = None            # exponentially smoothed loss
        self._window_start: float | None = None   # its value when the current window began
        self._in_window = 0                       # losses seen in the current window

    def _advance(self, candidate: str) -> None:
        if PHASES.index(candidate) > PHASES.index(self.phase):
            self.phase = candidate

    def _from_accuracy(self, accuracies: list[float]) -> None:
        for i in range(self._accuracies_seen, len(accuracies)):
            a, d = accuracies[i], accuracies[i] - accuracies[i - 1]
            if d <= self.begin_change and a > self.min_accuracy:  # else: still the beginning
                self._advance("final" if d < self.final_change else "middle")
        self._accuracies_seen = max(self._accuracies_seen, len(accuracies))

    def _from_loss(self, losses: list[float], reported: int) -> None:
        total = max(reported, len(losses))  # the synchronizer may trim `losses` to the newest
        fresh = losses[len(losses) - min(total - self._losses_seen, len(losses)):]
        self._losses_seen = total
        for loss in fresh:
            self._ema = loss if self._ema is None else self.smoothing * self._ema + (1 - self.smoothing) * loss
            if self._window_start is None:
                self._window_start = self._ema
                continue
            self._in_window += 1
            if self._in_window < self.loss_window:
                continue
            then = self._window_start
            r = (then - self._ema) / abs(then) if then else 0.0
            if r <= self.begin_change:  # else: still the beginning
                self._advance("final" if r < self.final_change and self.phase != "beginning" else "middle")
            self._window_start, self._in_window = self._ema, 0

    def bounds(self, round: int, layers: list[Layer], network: NetworkState,
               training: TrainingState) -> tuple[list[float], float | None]:
        if training.accuracies:
            self._from_accuracy(training.accuracies)
        else:
            self._from_loss(training.losses, training.losses_reported)
        bound = 0.0 if self.guard.active(round, training.update_norms) else self.phase_bounds[self.phase]
        return [bound] * len(layers), self.timer.deadline(network, bound)
