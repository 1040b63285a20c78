"""Bulk-synchronous rounds over a sparse plan."""
from __future__ import annotations

from p2plearn.sync.base import Synchronizer
from p2plearn.transport import Delivery


class BSP(Synchronizer):
    """In round r every peer sends to its receivers from round r's plan and waits for the
    messages that plan routes to it, each until its sender closes it (Early Close) or the
    round's deadline; dead senders are not waited for. No peer starts round r+1 before its
    round-r inputs have arrived or timed out. Messages of earlier rounds that arrive late are
    dropped; those of later rounds (faster peers) are kept for their round.
    """

    def _wait_round(self, rnd: int, senders: set[int], until: float) -> None:
        self.inbox.wait_round(rnd, senders, until, self._alive)

    def _inputs(self, rnd: int) -> list[Delivery]:
        self.inbox.drain()
        return self.inbox.take(rnd, rnd)
