"""Training's merge rule in virtual time: when each virtual peer merges a round, and what it takes.

    window = VirtualWindow(n, MergeWindow(staleness, ssp=True))
    merge_at = window.round(rnd, start, sends_done, flows, deadline)   # [n] virtual seconds
    taken = window.taken(rnd, merge_at, pending)                       # which pending deliveries merge

The rule is `sync.window.MergeWindow`'s, the synchronizers' own; this class only does its waiting
in virtual time, as `sync.bsp` and `sync.ssp` do it in wall time:
- BSP: a peer waits for the round's messages from its senders (the plan's), each until it arrived,
  at most `MergeWindow.wait_limit` after it started the round (its own deadline, or a few of its
  recent rounds; the cap at the start); then it holds until the slowest peer's clock reaches
  `hold_target` (at most the cap); it reports the next clock once that and its own sends are done,
  and merges what arrived of the round by then (a later arrival is dropped, as the inbox drops it);
- SSP: a peer reports the next clock when its sends are done, holds until the slowest peer's clock
  reaches `hold_target` (a hold past the cap fails as training's does), and merges what arrived of
  rounds `merged(rnd)` by then.
A peer's round time (what its typical round is the median of) runs from its start to its report,
as `RoundRecord`'s does. The virtual coordinator is never silent, so `stands_in` never applies.
"""
from __future__ import annotations

import numpy as np

from p2plearn.sync.window import RECENT_ROUNDS, MergeWindow


class VirtualWindow:
    """The merge rule for ``n`` virtual peers, with what it needs of their past rounds."""

    def __init__(self, n: int, rule: MergeWindow):
        self.rule = rule
        self.n = n
        self.recent = np.full((n, RECENT_ROUNDS), np.nan)  # per peer, its last round times (oldest first; nan: none)
        self.reported: dict[int, np.ndarray] = {}  # round r -> when each peer reported the clock r + 1

    def round(self, rnd: int, start: np.ndarray, sends_done: np.ndarray, flows: dict[str, np.ndarray],
              deadline: float | np.ndarray | None, planned_s: float) -> np.ndarray:
        """When each peer merges round `rnd`, having started it (its compute done) at start[i] and
        finished its sends at sends_done[i]; `flows` are the round's (dst, arrival) and `deadline`
        each peer's (None, one for all, or [n])."""
        reached = self._reached(self.rule.hold_target(rnd))
        if self.rule.ssp:
            report = sends_done
            if (reached - report > self.rule.round_cap_s).any():
                raise TimeoutError(f"SSP: the slowest live peer stayed below clock {self.rule.hold_target(rnd)} "
                                   f"for {self.rule.round_cap_s:g} s")
            merge_at = np.maximum(report, reached)
        else:
            last = start.copy()  # a peer without senders waits for none
            np.maximum.at(last, flows["dst"].astype(int), flows["arrival"])
            deadlines = np.broadcast_to(np.asarray(np.nan if deadline is None else deadline, dtype=float), (self.n,))
            limit = self.rule.wait_limits(np.where(np.isfinite(deadlines), deadlines, np.nan), self.recent,
                                          joined=False, planned_s=planned_s)
            waited = np.minimum(last, start + limit)
            held = np.maximum(waited, np.minimum(reached, waited + self.rule.round_cap_s))
            report = np.maximum(held, sends_done)
            merge_at = report
        self.recent[:, :-1] = self.recent[:, 1:]
        self.recent[:, -1] = report - start
        self.reported[rnd] = report
        self.reported.pop(rnd + self.rule.hold_target(0) - 1, None)  # the next round's target is past it
        return merge_at

    def taken(self, rnd: int, merge_at: np.ndarray, pending: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Of the `pending` deliveries (round, dst, arrival), which round `rnd`'s merges take (those
        of its merged rounds that arrived by their receiver's merge), and which are gone after it
        (taken, or of a round no later merge takes)."""
        first, last = self.rule.merged(rnd)
        rounds = pending["round"]
        taken = (rounds >= first) & (rounds <= last) & (pending["arrival"] <= merge_at[pending["dst"].astype(int)])
        return taken, taken | (rounds < self.rule.merged(rnd + 1)[0])

    def _reached(self, target: int) -> float:
        """When the slowest peer's clock reached `target` (every peer reported it): -inf for the clock
        every peer starts at."""
        if target <= 0:
            return -np.inf
        return float(self.reported[target - 1].max())
