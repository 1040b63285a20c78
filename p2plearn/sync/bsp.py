"""Bulk-synchronous rounds over a sparse plan."""
from __future__ import annotations

from p2plearn.sync.base import Synchronizer
from p2plearn.sync.robust import RobustMerge


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
