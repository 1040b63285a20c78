"""`OverlappedRound`: a communication round in a thread of its own, on the host arrays, while the
training thread takes the next local steps (``--overlap``); its result is mixed into the model,
which moved on meanwhile, when it lands.

Tuning: ``overlap_steps`` (tau) is how many local steps after its start a round lands (at the
latest, as the next round starts): its result is that many steps late; try the fewest steps
whose compute covers a round's transfer. ``alpha`` is how it lands: None adds the round's change
to the model (keeping the local steps taken meanwhile), alpha in (0, 1] moves the model alpha of
the way to the round's result.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from p2plearn.sync import RoundStats, Synchronizer
from p2plearn.train.staging import HostStaging


class OverlappedRound:
    """At most one round in flight: `start` it after a local step, `finish` it when `due` (or
    before anything reads or replaces the model). Used from the training thread only; the round's
    own thread touches the host arrays and the synchronizer, never the model."""

    def __init__(self, sync: Synchronizer, staging: HostStaging, overlap_steps: int, alpha: float | None):
        self.sync = sync
        self.staging = staging
        self.overlap_steps = overlap_steps
        self.alpha = alpha
        self._thread: threading.Thread | None = None  # the round in flight
        self._start_step = 0  # the local step it started at
        self._arrays: list[int] = []  # the arrays it carries (its fragment)
        self._outcome: RoundStats | BaseException | None = None  # written by its thread, read after the join
        self._snapshot: dict[int, np.ndarray] = {}  # what it started from, by array (add-the-change mixing only)

    def due(self, steps: int) -> bool:
        """Whether the round in flight should land now, `steps` local steps into training."""
        return self._thread is not None and steps - self._start_step >= self.overlap_steps

    def start(self, loss: float | None, steps: int) -> None:
        """Start a round from the model as it is after local step `steps` (its copy to the host is
        queued here; the round's thread waits for it, the training thread does not)."""
        self.staging.to_host()
        self._start_step, self._arrays = steps, self.sync.fragments.arrays(self.sync.clock)

        def run() -> None:
            try:
                self.staging.wait_host()  # this thread waits for the copy; the training thread goes on
                if self.alpha is None:
                    self._snapshot = self.staging.snapshot(self._arrays)
                self._outcome = self.sync.step(loss=loss)
            except BaseException as exc:  # noqa: BLE001 - raised again in the training thread
                self._outcome = exc

        self._thread = threading.Thread(target=run, name=f"p2plearn-round-{self.sync.clock}", daemon=True)
        self._thread.start()

    def finish(self, apply: bool = True) -> tuple[float, RoundStats | None]:
        """Wait for the round in flight (if any) and, with `apply`, mix its result into the model;
        returns the seconds waited and the round's stats (None: no round was in flight). The
        round's error, if it failed, is raised here."""
        if self._thread is None:
            return 0.0, None
        t0 = time.monotonic()
        self._thread.join()
        waited = time.monotonic() - t0
        self._thread, outcome, self._outcome = None, self._outcome, None
        if isinstance(outcome, BaseException):
            raise outcome
        if apply and self.alpha is None:
            self.staging.add_change(self._snapshot)
        elif apply:
            self.staging.mix(self._arrays, self.alpha)
        self._snapshot = {}
        return waited, outcome
