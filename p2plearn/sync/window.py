"""Which deliveries a round merges, and how long it waits for them: training's rule, with no clock.

    window = MergeWindow(staleness=2, ssp=True, round_cap_s=30.0)
    lo, hi = window.wanted(clock)             # rounds whose messages are worth keeping now
    lo, hi = window.merged(rnd)               # rounds merged after round rnd
    target = window.hold_target(rnd)          # the slowest clock that round rnd waits for
    limit = window.wait_limit(deadline, recent_round_s, joined=False, planned_s=0.1)

The synchronizers (`sync.bsp`, `sync.ssp`) read the rule here and do the waiting with the engine's
inbox and the control plane's clock in wall time; the simulator (`sim.train`) reads the same rule
and does the waiting in virtual time. Nothing here reads a clock, a socket or a model: inputs are
the round, the staleness, recent round times, the deadline and what has been heard.

Tuning: the constants below. LATE_SENDER and MIN_WAIT_S trade a round lost to a stalled sender
against merging without a sender that was only late; AHEAD_ROUNDS bounds how far a BSP peer with
nothing to wait for may run ahead of the job.
"""
from __future__ import annotations

from collections.abc import Sequence
import statistics
from dataclasses import dataclass

import numpy as np

GRACE_S = 0.25        # after a sender's deadline, time for its CLOSE to reach us
LATE_SENDER = 3.0     # deadlines (or typical rounds) a receiver waits for a sender that started late
AHEAD_ROUNDS = 16     # beyond the staleness window, how far ahead a sender's round may be and still be kept
MIN_WAIT_S = 1.0      # without a deadline, never give up on an expected sender sooner than this
JOINER_WAIT_S = 2.0   # a peer that joined a running job, before it has rounds of its own: at least this
RECENT_ROUNDS = 10    # a peer's last rounds whose median time is its typical round
TYPICAL_AFTER = 3     # rounds of its own before a peer has a typical round


@dataclass(frozen=True)
class MergeWindow:
    """The merge rule of BSP (``ssp=False``: round r merges round r's messages, and a peer runs at
    most AHEAD_ROUNDS ahead of the slowest live peer) or SSP (``ssp=True``: round r waits until the
    slowest live peer's clock is r + 1 - s, then merges rounds r - s..r).

    staleness: SSP's s (0 for BSP); round_cap_s: the longest any wait may last (a safety net).
    """

    staleness: int = 0
    ssp: bool = False
    round_cap_s: float = 30.0

    def __post_init__(self):
        if self.staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {self.staleness}")

    def wanted(self, clock: int) -> tuple[int, int]:
        """Rounds whose messages are worth keeping at clock `clock`: from the one being merged (the
        clock is one ahead of it by then) to as far ahead as a live peer may legitimately be."""
        return clock - 1 - self.staleness, clock + self.staleness + AHEAD_ROUNDS

    def merged(self, rnd: int) -> tuple[int, int]:
        """The first and last round whose messages the merge after round `rnd` takes."""
        return rnd - self.staleness, rnd

    def hold_target(self, rnd: int) -> int:
        """The slowest live peer's clock that round `rnd` waits for before it merges: SSP's bound,
        or for BSP the clock that keeps this round's message wanted by the slowest peer."""
        return rnd + 1 - (self.staleness if self.ssp else AHEAD_ROUNDS)

    def wait_limit(self, deadline: float | None, recent: Sequence[float], *, joined: bool, planned_s: float) -> float:
        """Seconds a round may wait for its senders. Each sender closes its message by its own
        deadline, but may start later than this peer (it was still computing): wait a few
        deadlines for it; without one, a few typical rounds (the median of `recent`, this peer's
        last round times, oldest first); never past the cap.

        Before a peer has typical rounds of its own: at the job's start every peer waits up to the
        cap (all start together, and a straggler's first steps may take long); a peer that `joined`
        a running job waits a few of the plan's T (`planned_s`). A sender that planned its round
        with the view before the joiner's does not send to it, and waiting the cap for one cost a
        restarted peer 30 s of a 12 s run on a loaded machine."""
        tail = list(recent)[-RECENT_ROUNDS:]
        median = statistics.median(tail) if len(tail) >= TYPICAL_AFTER else np.nan
        return float(self._limits(np.nan if deadline is None else deadline, median, joined, planned_s))

    def wait_limits(self, deadlines: np.ndarray, recent: np.ndarray, *, joined: bool, planned_s: float) -> np.ndarray:
        """`wait_limit` of many peers at once (the simulator's): deadlines [n] (nan or 0: none), recent
        [n, k] each peer's last round times (nan where it has none yet)."""
        recent = recent[:, -RECENT_ROUNDS:]
        typical = np.count_nonzero(~np.isnan(recent), axis=1) >= TYPICAL_AFTER
        median = np.full(len(recent), np.nan)
        median[typical] = np.nanmedian(recent[typical], axis=1)  # rows of TYPICAL_AFTER values or more
        return self._limits(deadlines, median, joined, planned_s)

    def _limits(self, deadline, median, joined: bool, planned_s: float):
        """The rule of `wait_limit`, on numbers or on arrays of them (one per peer): deadline nan or 0
        for none, median nan before a peer has a typical round. (A peer's own wait takes the scalar
        path: numpy's nanmedian costs ~100 us a call, a share of a 10 MiB round.)"""
        first = min(self.round_cap_s, max(JOINER_WAIT_S, LATE_SENDER * planned_s + GRACE_S)) if joined else self.round_cap_s
        without = np.where(np.isnan(median), first, np.maximum(MIN_WAIT_S, LATE_SENDER * np.fmax(median, 0.0) + GRACE_S))
        deadline = np.fmax(deadline, 0.0)  # (fmax: nan becomes 0, none)
        return np.minimum(self.round_cap_s, np.where(deadline > 0, LATE_SENDER * deadline + GRACE_S, without))

    @staticmethod
    def stands_in(target: int, *, clock_current: bool, newest_heard: int, now: float, until: float) -> bool:
        """Whether a hold for the slowest clock `target` may end before the control plane's clock
        says so: only while that clock is stale (the coordinator is silent), when a peer was heard
        at round `target` or later, or the round's own limit `until` passed (`now` past it), so
        that an outage costs no step."""
        return not clock_current and (newest_heard >= target or now > until)
