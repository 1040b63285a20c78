from __future__ import annotations

import numpy as np

from p2plearn.selection import NetworkView


def random_view(rng: np.random.Generator, n: int, equal: bool, receiver_tight: bool = False,
                dead: float = 0.1) -> NetworkView:
    """Heterogeneous rates from tiers (x 0.8-1.2); uplinks below downlinks, or (receiver_tight) above
    them so that downlinks are the bottleneck; equal or unequal message sizes; some peers dead."""
    down = rng.choice([1.0, 2, 5, 10, 20], n) * rng.uniform(0.8, 1.2, n)
    up = down * (rng.uniform(0.5, 4.0, n) if receiver_tight else rng.uniform(0.2, 1.0, n))
    sizes = np.ones(n) if equal else rng.uniform(0.3, 3.0, n)
    return NetworkView(up * 1e6, down * 1e6, sizes * 1e6, rng.random(n) >= dead)
