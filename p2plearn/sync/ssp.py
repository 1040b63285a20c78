"""Stale-synchronous rounds: run ahead of the slowest peer by at most `staleness` rounds."""
from __future__ import annotations

import time

from p2plearn.sync.base import Synchronizer
from p2plearn.sync.merge import OrderedFolds
from p2plearn.sync.robust import RobustMerge
from p2plearn.sync.window import MergeWindow


class SSP(Synchronizer):
    """A peer with clock c may start step c+1 only while c - (slowest live peer's clock) <= s.

    After its own send of round r completes (its receivers then hold that message), a peer
    reports clock r+1 and waits until the slowest live peer reaches r+1-s, then merges whatever
    has arrived from rounds r-s..r; older messages are past the bound and dropped. The slowest
    clock is over live peers only, so it never blocks on a dead peer. With s = 0 every round-r
    message has arrived when the wait ends: it behaves like BSP. While the coordinator is silent
    (failing over) the slowest clock is stale; a message from a peer within the bound stands in for
    it (``Synchronizer._hold``). With ``fragments`` (see `p2plearn.sync.fragments`) the rounds
    merged together carry different fragments: each message merges into its own round's arrays.

    Args (beyond Synchronizer's): staleness: s. Larger hides stragglers and bursts better but
    merges older models; 1-4 is typical. The rule is `sync.window.MergeWindow`'s, which the
    simulator runs in virtual time. robust: the robust merge
    (`sync.robust`, ``--robust``); None: plain.
    """

    def __init__(self, *args, staleness: int = 2, robust: RobustMerge | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.window = MergeWindow(staleness, ssp=True, round_cap_s=self.round_cap_s)  # refuses a negative s
        self.robust = robust

    def _wait_round(self, rnd: int, senders: set[int], until: float, merge: OrderedFolds) -> None:
        """Nothing to wait for while sending: SSP's wait is on the clocks, after the send."""

    def _gather(self, rnd: int, merge: OrderedFolds) -> None:
        """Wait for the slowest clock SSP's bound allows, offering `merge` what comes meanwhile
        (folded while the wait is idle), then the rest."""
        def idle() -> None:
            for d in self.inbox.take(*self.window.merged(rnd)):
                self._offer(merge, d)
            merge.fold_due()

        target = self.window.hold_target(rnd)
        if not self._hold(target, time.monotonic() + self._wait_limit(None), idle):
            raise TimeoutError(f"SSP: the slowest live peer stayed below clock {target} for "
                               f"{self.round_cap_s:g} s")
        super()._gather(rnd, merge)
