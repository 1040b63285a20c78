"""Phi-accrual failure detection (Hayashibara et al. 2004; as in Akka and Cassandra).

Instead of "dead after k missed heartbeats", the detector learns how heartbeats actually arrive
and reports a suspicion level: ``phi = -log10(P(a heartbeat comes this late))`` under a normal
distribution fitted to the recent inter-arrival times. A loaded machine, whose heartbeats come
irregularly, widens the distribution and is suspected later; a quiet one is suspected soon after
its rhythm breaks. Nothing is final: a heartbeat from a suspected process makes it trusted again.
"""

from __future__ import annotations

import math
import time
from collections import deque


class PhiAccrualDetector:
    """Suspicion of one monitored process, from the times its heartbeats arrived.

    - ``interval``: the expected time between heartbeats (s); seeds the distribution.
    - ``threshold``: phi above which the process is suspected. 8 means a one-in-10^8 chance that a
      live process with the observed rhythm is this late; lower detects sooner, with more false
      suspicions. With a 0.5 s heartbeat and the defaults a silent process is suspected ~1.4 s after
      its last heartbeat on a quiet machine, later on a busy one.
    - ``min_std``: floor on the spread (s), so that a perfectly regular heartbeat does not make a few
      milliseconds of scheduling jitter look like a death.
    - ``acceptable_pause``: silence always tolerated beyond the mean interval (s): GC or a short
      stall of the sender's thread.
    - ``grace`` / ``warmup``: until ``warmup`` intervals have been seen (None: until ``end_warmup()``)
      the process is suspected only after ``grace`` s of silence: a process starting up (importing
      torch, say) may hold its interpreter lock for seconds while its heartbeat thread waits.
      ``end_warmup()`` ends it (e.g. once the peer reported its first round).
    - ``window``: intervals remembered.

    A lost connection (``lost()``: the process's socket closed, as it does when the process dies)
    shortcuts the wait: the process is suspected once ``interval`` more passes without a heartbeat,
    whatever phi says. A process that is only slow keeps its connection, so this never hastens a
    verdict on a stall.
    """

    def __init__(self, interval: float, *, threshold: float = 8.0, min_std: float = 0.1,
                 acceptable_pause: float = 0.3, grace: float = 10.0, warmup: int | None = 5, window: int = 100,
                 now: float | None = None) -> None:
        self.interval = interval
        self.threshold = threshold
        self.min_std = min_std
        self.acceptable_pause = acceptable_pause
        self.grace = grace
        self.warmup = warmup
        self._intervals: deque[float] = deque(maxlen=window)
        self._sum = 0.0     # running sums of the remembered intervals: checks are O(1)
        self._sumsq = 0.0
        self._warm = False
        self._lost_at: float | None = None
        self.last = time.monotonic() if now is None else now

    def heartbeat(self, now: float | None = None) -> None:
        """A heartbeat (or any message) arrived from the process."""
        now = time.monotonic() if now is None else now
        gap = max(0.0, now - self.last)
        if len(self._intervals) == self._intervals.maxlen:
            old = self._intervals[0]
            self._sum -= old
            self._sumsq -= old * old
        self._intervals.append(gap)
        self._sum += gap
        self._sumsq += gap * gap
        self.last = now
        self._lost_at = None
        self._warm = self._warm or (self.warmup is not None and len(self._intervals) >= self.warmup)

    def lost(self, now: float | None = None) -> None:
        """The process's connection closed (see the class docstring)."""
        self._lost_at = time.monotonic() if now is None else now

    def end_warmup(self) -> None:
        self._warm = True

    def phi(self, now: float | None = None) -> float:
        """The suspicion level now (0 right after a heartbeat, growing with silence)."""
        now = time.monotonic() if now is None else now
        silence = now - self.last
        mean, std = self._fit()
        z = (silence - mean - self.acceptable_pause) / std
        # P(X > silence) for a normal X; erfc keeps precision far in the tail.
        p_later = 0.5 * math.erfc(z / math.sqrt(2.0))
        return -math.log10(max(p_later, 1e-300))

    def suspected(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if self._lost_at is not None and now - self._lost_at > self.interval:
            return True
        if not self._warm:
            return now - self.last > self.grace
        return self.phi(now) > self.threshold

    def verdict(self, now: float | None = None) -> str:
        """Why the process is (or would be) suspected, for logs."""
        now = time.monotonic() if now is None else now
        if self._lost_at is not None and now - self._lost_at > self.interval:
            return "its connection closed"
        if not self._warm:
            return f"start-up grace of {self.grace:g} s"
        return f"phi {self.phi(now):.1f} > {self.threshold:g}"

    def timeout(self) -> float:
        """Seconds of silence after which the process is suspected, as things stand."""
        if not self._warm:
            return self.grace
        mean, std = self._fit()
        # Inverse of phi(): z such that P(X > mean + pause + z std) = 10^-threshold (bisection: no scipy).
        lo, hi = 0.0, 40.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if -math.log10(max(0.5 * math.erfc(mid / math.sqrt(2.0)), 1e-300)) > self.threshold:
                hi = mid
            else:
                lo = mid
        return mean + self.acceptable_pause + hi * std

    def _fit(self) -> tuple[float, float]:
        n = len(self._intervals)
        if not n:
            return self.interval, max(self.min_std, self.interval / 4)
        mean = self._sum / n
        var = max(0.0, self._sumsq / n - mean * mean)
        return mean, max(self.min_std, math.sqrt(var))
