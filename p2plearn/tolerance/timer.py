"""Round timing shared by the adaptive policies: a robust clean-round estimate, straggler detection
and the quorum-style deadline derived from them."""
from __future__ import annotations

import numpy as np

from p2plearn.tolerance.base import NetworkState, RoundRecord

# Scales the median absolute deviation to a standard deviation for normally distributed times.
_MAD_TO_STD = 1.4826
# Floor of the spread, as a fraction of the median, so that identical past rounds do not flag
# every tiny jitter as a straggler.
_MIN_SPREAD = 0.05


class RoundTimer:
    """Estimates how long a clean round takes, flags straggling rounds, and sets the deadline.

    Each past round gives a *full-time sample*: elapsed / delivered fraction (the time the whole
    message would have taken at that round's pace; the loss-tolerant all-reduce literature's
    "elapsed / completion ratio"), scaled by expected_bytes / message_bytes when both are known
    so that rounds of different message sizes (e.g. after a filter) compare. The clean estimate
    is the median of the last `window` samples, so one straggler does not move it; before
    `min_history` rounds it is the selection plan's T(plan) (`NetworkState.planned_time_s`).

    deadline = clamp(slack * (1 - bound) * clean, min_deadline_s, max_deadline_s): a clean receiver
    reaches the early-close quorum (1 - bound of the data) in about (1 - bound) * clean, so the
    deadline only cuts receivers that are `slack` times slower than that. With no estimate at all
    the deadline is the hard cap.

    Args (tuning):
        slack: headroom over the clean time (> 1). Raise it (2-3) on jittery networks where
            clean rounds vary a lot; lower it (1.2) to cut stragglers sooner and accept more loss.
        k: a round straggles when its full-time sample exceeds median + k * spread of the
            previous rounds (spread = 1.4826 * MAD, at least 5% of the median). 3 is the usual
            outlier rule; lower flags more rounds.
        straggler_ratio: a round also straggles when its slowest receiver's delivery rate falls
            below this fraction of the slowest receiver's recent median rate.
        window: rounds the estimates look back. Longer is steadier, shorter follows changes in
            the network (e.g. a topology event) faster.
        min_history: rounds needed before measured times replace T(plan).
        max_deadline_s: hard cap (None = no cap; then no deadline until rounds were measured).
            Set it to the longest stall training may tolerate.
        min_deadline_s: floor, so that a tiny clean time (loopback) cannot give a deadline the
            engine cannot meet.
    """

    def __init__(self, slack: float = 1.5, k: float = 3.0, straggler_ratio: float = 0.5,
                 window: int = 20, min_history: int = 3, max_deadline_s: float | None = 30.0,
                 min_deadline_s: float = 0.01):
        if slack < 1:
            raise ValueError(f"slack must be >= 1, got {slack}")
        if k <= 0:
            raise ValueError(f"k must be > 0, got {k}")
        if not 0 < straggler_ratio < 1:
            raise ValueError(f"straggler_ratio must be in (0, 1), got {straggler_ratio}")
        if window < 2 or min_history < 2 or min_history > window:
            raise ValueError(f"need 2 <= min_history <= window, got {min_history}, {window}")
        if min_deadline_s <= 0 or (max_deadline_s is not None and max_deadline_s < min_deadline_s):
            raise ValueError(f"need 0 < min_deadline_s <= max_deadline_s, got {min_deadline_s}, {max_deadline_s}")
        self.slack = slack
        self.k = k
        self.straggler_ratio = straggler_ratio
        self.window = window
        self.min_history = min_history
        self.max_deadline_s = max_deadline_s
        self.min_deadline_s = min_deadline_s

    def _full_times(self, records: list[RoundRecord], expected_bytes: int) -> np.ndarray:
        out = []
        for r in records:
            t = r.elapsed_s / max(r.delivered, 1e-3)  # a round that delivered ~nothing says little
            if expected_bytes > 0 and r.message_bytes > 0:
                t *= expected_bytes / r.message_bytes
            out.append(t)
        return np.asarray(out, dtype=float)

    def clean_time(self, network: NetworkState) -> float | None:
        """Robust estimate of a clean round's full-message time (s), or None when nothing is known."""
        recent = network.history[-self.window:]
        if len(recent) >= self.min_history:
            return float(np.median(self._full_times(recent, network.expected_bytes)))
        return network.planned_time_s if network.planned_time_s > 0 else None

    def straggled(self, network: NetworkState) -> bool:
        """Whether the newest round was slow against the rounds before it (time or delivery rate)."""
        if len(network.history) <= self.min_history:
            return False
        before = network.history[-self.window - 1:-1]
        last = network.history[-1]
        times = self._full_times(before, network.expected_bytes)
        med = float(np.median(times))
        spread = max(_MAD_TO_STD * float(np.median(np.abs(times - med))), _MIN_SPREAD * med)
        if self._full_times([last], network.expected_bytes)[0] > med + self.k * spread:
            return True
        slowest = [min(r.delivery_rates) for r in before if r.delivery_rates]
        return bool(last.delivery_rates and slowest
                    and min(last.delivery_rates) < self.straggler_ratio * float(np.median(slowest)))

    def deadline(self, network: NetworkState, bound: float) -> float | None:
        """The round's deadline (s) for a loss bound, or None (no deadline) when nothing bounds it."""
        clean = self.clean_time(network)
        if clean is None:
            return self.max_deadline_s
        d = max(self.min_deadline_s, self.slack * (1.0 - bound) * clean)
        return d if self.max_deadline_s is None else min(d, self.max_deadline_s)
