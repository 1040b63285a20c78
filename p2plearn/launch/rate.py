"""The rounds/s of the launcher's progress line."""

from __future__ import annotations

from collections import deque


class RoundRate:
    """Rounds per second of the slowest peer over the last ``window`` seconds.

    A round can take longer than the progress line's refresh: a rate over the last refresh alone
    reads 0 most of the time. Over a window of several rounds it reads what the job does.
    """

    def __init__(self, window: float = 10.0) -> None:
        self.window = window
        self._samples: deque[tuple[float, int]] = deque()

    def update(self, now: float, clock: int) -> float | None:
        """Add the slowest clock seen at ``now``; the rate, or None before any round was seen."""
        self._samples.append((now, clock))
        # Keep one sample at or beyond the window's start, so the span covers the whole window.
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window:
            self._samples.popleft()
        first_time, first_clock = self._samples[0]
        if clock == 0 or now <= first_time:
            return None
        return (clock - first_clock) / (now - first_time)
