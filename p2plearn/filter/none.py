"""The identity filter: every layer is sent dense, every round."""
from __future__ import annotations

from typing import Any, Sequence

from p2plearn.filter.base import UpdateFilter
from p2plearn.filter.wire import EncodedUpdate, pack


class NoFilter(UpdateFilter):
    """Sends the dense updates unchanged (as float32). The baseline; use it when bandwidth is
    plentiful or to measure what a filter saves. No arguments."""

    name = "none"

    def encode(self, round: int, updates: Sequence[Any]) -> EncodedUpdate:
        flat = self._flat(round, updates)
        return self._count(pack(list(flat), sum(u.nbytes for u in flat)))
