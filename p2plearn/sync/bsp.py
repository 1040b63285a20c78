"""Bulk-synchronous rounds over a sparse plan."""
from __future__ import annotations

from p2plearn.sync.base import Synchronizer
from p2plearn.sync.robust import RobustMerge
from p2plearn.transport import Delivery


class BSP(Synchronizer):
    """In round r every peer sends to its receivers from round r's plan and waits for the
    messages that plan routes to it, each until its sender closes it (Early Close) or the
    round's deadline; dead senders, and senders already past round r, are not waited for. No
    peer starts round r+1 before its round-r inputs have arrived or timed out. Messages of
    earlier rounds that arrive late are dropped; those of later rounds (faster peers) are kept
    for their round.

    A plan may leave a peer without senders (SELMCAST gives none to a peer whose downlink or
    compute cannot take a message by T), and such a peer has nothing to wait for: it would run
    ahead of the job without bound, its messages dropped as too far ahead and its model mixed with
    nobody's. So no peer runs more than ``AHEAD_ROUNDS`` ahead of the slowest live peer (the
    control plane's clock, as SSP's bound; in step with the job it never binds; see
    ``Synchronizer._hold`` for a silent coordinator). The rule is `sync.window.MergeWindow`'s, which
    the simulator runs in virtual time.

    Args (beyond Synchronizer's): robust: the robust merge (`sync.robust`, ``--robust``); None: plain.
    """

    def __init__(self, *args, robust: RobustMerge | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.robust = robust

    def _wait_round(self, rnd: int, senders: set[int], until: float) -> None:
        self.inbox.wait_round(rnd, senders, until, self._alive)
        self._hold(self.window.hold_target(rnd), until)  # the slowest clock that keeps this round's message wanted

    def _inputs(self, rnd: int) -> list[Delivery]:
        self.inbox.drain()
        return self.inbox.take(*self.window.merged(rnd))
