"""Accordion's critical-regime detector: a sudden change of the update norm means exact delivery."""
from __future__ import annotations

import numpy as np

from p2plearn.stateful import Stateful


class CriticalRegimeGuard(Stateful):
    """Every `k` rounds, compares the mean whole-model update norm of the last k rounds with the
    k rounds before; a relative change above `eta` marks a critical regime (e.g. a learning-rate
    change, the early rounds of training) and the guard stays active for the next k rounds.

    Args (tuning):
        k: rounds per check and per forced-exact period. Use about the number of rounds over
            which the update norm is steady (Accordion: 10); shorter reacts faster but noisier.
        eta: relative change of the norm that counts as critical (Accordion: 0.5). Lower makes
            the guard fire more often (safer, more exact rounds).
    """

    STATE = ("_checked_round", "_active_until")

    def __init__(self, k: int = 10, eta: float = 0.5):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if eta <= 0:
            raise ValueError(f"eta must be > 0, got {eta}")
        self.k = k
        self.eta = eta
        self._checked_round: int | None = None
        self._active_until = -1  # first round after the forced-exact period

    def active(self, round: int, update_norms: list[float]) -> bool:
        """Whether `round` must be exact; `update_norms` is the per-round history, newest last."""
        due = self._checked_round is None or round >= self._checked_round + self.k
        if due and len(update_norms) >= 2 * self.k:
            self._checked_round = round
            previous = float(np.mean(update_norms[-2 * self.k:-self.k]))
            current = float(np.mean(update_norms[-self.k:]))
            if previous > 0 and abs(current - previous) / previous > self.eta:
                self._active_until = round + self.k
        return round < self._active_until
