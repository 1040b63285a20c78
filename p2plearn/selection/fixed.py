"""Bandwidth-blind fixed topologies over the live peers: all-to-all, ring, exponential.

Positions are taken in the list of live peers (ascending rank), so a dead peer is skipped rather
than leaving a hole. p larger than live - 1 is clamped to live - 1.
"""
from __future__ import annotations

from p2plearn.selection.base import SelectionPolicy
from p2plearn.selection.random_p import live_peers
from p2plearn.selection.view import NetworkView


class AllToAll(SelectionPolicy):
    """Every live sender sends to every other live peer (p is only checked): the largest p, the slowest round."""

    name = "all"

    def plan(self, view: NetworkView, p: int, round: int) -> dict[int, list[int]]:
        live = live_peers(view, p).tolist()
        return {i: [j for j in live if j != i] for i in live}


class Ring(SelectionPolicy):
    """The t-th live peer sends to the next p live peers (cyclically); the same every round."""

    name = "ring"

    def plan(self, view: NetworkView, p: int, round: int) -> dict[int, list[int]]:
        return _by_offsets(live_peers(view, p).tolist(), lambda L, k: range(1, k + 1), p)


class Exponential(SelectionPolicy):
    """The t-th live peer sends to the live peers 2^k positions ahead, for p values of k.

    The exponents rotate with the round (round, round + 1, ... modulo the number of powers of two
    below the live count), so information spreads in O(log n) rounds even with p = 1. Where p exceeds
    the number of distinct powers, the smallest other offsets fill up (ring-like).
    """

    name = "exponential"

    def plan(self, view: NetworkView, p: int, round: int) -> dict[int, list[int]]:
        def offsets(L: int, k: int) -> list[int]:
            powers = [1 << e for e in range(max(L - 1, 1).bit_length())]   # 2^e <= L - 1
            chosen = [powers[(round + t) % len(powers)] for t in range(min(k, len(powers)))]
            return chosen + [d for d in range(1, L) if d not in chosen][:k - len(chosen)]

        return _by_offsets(live_peers(view, p).tolist(), offsets, p)


def _by_offsets(live: list[int], offsets, p: int) -> dict[int, list[int]]:
    """Sender at position t sends to positions t + d (mod L) for d in offsets(L, min(p, L - 1))."""
    L = len(live)
    ds = list(offsets(L, min(p, L - 1))) if L > 1 else []
    return {i: [live[(t + d) % L] for d in ds] for t, i in enumerate(live)}
