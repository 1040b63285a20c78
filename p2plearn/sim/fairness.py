"""Max-min fair rates of flows over shared links (progressive filling, vectorised)."""
from __future__ import annotations

import numpy as np

# Relative slack for "at capacity" / "at cap": float sums of shares are not exact.
RTOL = 1e-9


def max_min_rates(src: np.ndarray, dst: np.ndarray, uplink: np.ndarray, downlink: np.ndarray,
                  cap: np.ndarray | None = None, shared: float = np.inf) -> np.ndarray:
    """The max-min fair rate of each flow src[k] -> dst[k] (bytes/s).

    Each flow crosses its sender's uplink and its receiver's downlink; `cap` (per flow, inf = none)
    is an upper bound of its own, such as the pacing rate. `shared` is the capacity of one more
    link that every flow crosses (the CPUs of a single host that emulates all peers).
    Progressive filling: all unfrozen flows rise together; each iteration either freezes every flow
    whose cap lies below the lowest level at which a link would fill, or fills that link and freezes
    its flows, so it ends within (links + 2) iterations, each O(flows) with np.bincount. When the
    caps already fit every link (the paced case) one iteration does.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    n = len(uplink)
    f = len(src)
    cap = np.full(f, np.inf) if cap is None else np.asarray(cap, dtype=float)
    link = np.concatenate([src, dst + n])        # flow k crosses links link[k] and link[k + f]
    capacity = np.concatenate([uplink, downlink]).astype(float)
    rate = np.zeros(f)
    free = np.ones(f, dtype=bool)
    while free.any():
        both = np.concatenate([free, free])
        count = np.bincount(link[both], minlength=2 * n)
        used = np.bincount(link, weights=np.concatenate([rate, rate]) * ~both, minlength=2 * n)
        with np.errstate(divide="ignore", invalid="ignore"):
            level = np.where(count > 0, (capacity - used) / count, np.inf)
        shared_level = (shared - rate[~free].sum()) / free.sum()
        fill = min(level.min(), shared_level)
        capped = free & (cap <= fill * (1 + RTOL))
        if capped.any():
            # Flows capped below every link's fill level stop at their caps first; freeing what
            # they leave raises the links' levels, so the next iteration recomputes them.
            rate[capped] = cap[capped]
            free &= ~capped
            continue
        full = level <= fill * (1 + RTOL)
        hit = free & (full[link[:f]] | full[link[f:]] | (shared_level <= fill * (1 + RTOL)))
        rate[hit] = max(fill, 0.0)
        free &= ~hit
    return rate
