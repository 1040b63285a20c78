"""The usual baseline: exactly p receivers per sender, uniformly at random, blind to bandwidth."""
from __future__ import annotations

import numpy as np

from p2plearn.selection.base import SelectionPolicy
from p2plearn.selection.view import NetworkView


class RandomP(SelectionPolicy):
    """Each live sender draws min(p, live - 1) distinct live receivers other than itself.

    seed: with the round, seeds the draw (every peer must use the same seed to agree on the plan);
        each round draws afresh.
    """

    name = "random"

    def plan(self, view: NetworkView, p: int, round: int) -> dict[int, list[int]]:
        live = live_peers(view, p)
        k = min(p, len(live) - 1)
        rng = np.random.default_rng([self.seed, round])
        plan = {}
        for t, i in enumerate(live):
            others = np.delete(live, t)
            plan[int(i)] = sorted(rng.choice(others, size=k, replace=False).tolist())
        return plan


def live_peers(view: NetworkView, p: int) -> np.ndarray:
    """The live peers' ranks, ascending; checks p (shared by the bandwidth-blind policies)."""
    if p < 0:
        raise ValueError(f"p must be >= 0, got {p}")
    return np.flatnonzero(np.asarray(view.alive, dtype=bool))
