"""Value-bounded filter: small changes wait (with their residual kept) until they matter."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from p2plearn.filter.base import UpdateFilter
from p2plearn.filter.wire import EncodedUpdate, Entry, pack

GRANULARITIES = ("per_layer", "per_element")


class ValueFilter(UpdateFilter):
    """Drops updates below a decaying threshold and keeps them as residuals, so nothing is lost,
    only delayed: threshold(round) = init / (round + 1) ** (1 / a)  (rounds count from 0).

    Each round a layer's accumulation is acc = residual + update, then:
      per_element: elements with |acc| >= threshold are sent, the others stay in the residual
          (error feedback). The layer travels sparse (int32 indices + float32 values) or, when
          at least half its elements pass (sparse would be larger), dense: then every element, the
          small ones too (receivers read every element's current value), and its residual empties.
      per_layer: the layer is sent dense when mean |acc| >= threshold; otherwise it is deferred
          (acc becomes the residual) and flushed once the accumulation crosses the threshold.
    In both, what was sent plus the residual equals the sum of all updates (up to float32 rounding).

    Use it to cut bandwidth on slow links: updates are heavy-tailed, so most elements are small
    and can wait. per_element saves more; per_layer keeps messages dense (no index overhead).

    Args (tuning):
        granularity: "per_element" or "per_layer".
        init: the threshold at round 0, in units of the updates. None = init_scale times the
            mean |update| over all elements of the first encoded round, which adapts to the
            model and learning rate. To tune per model, raise it until accuracy per round
            starts to drop, and watch stats()["ratio"] (dense / sent bytes).
        a: decay exponent (> 0). 2 halves the threshold by round 3, a quarter by round 15;
            a = 3 decays more slowly and keeps messages small for longer. Because the threshold
            decays, late training sends almost everything.
        init_scale: multiple of the first round's mean |update| used when init is None (> 0).
            1 sends about the largest third of Laplace-distributed elements at first. With
            momentum SGD the first update is ~1/(1 - momentum) times smaller than later ones:
            scale up accordingly (10 for momentum 0.9).
        period: rounds per unit of t in the decay (>= 1). 1 decays per round, as in the
            literature's parameter-server setting; set it to the rounds per epoch when the
            learning rate is constant, or late rounds send almost everything.
    """

    name = "value"
    STATE = UpdateFilter.STATE + ("init", "_residuals", "_shapes")

    def __init__(self, granularity: str = "per_element", init: float | None = None, a: float = 2.0,
                 init_scale: float = 1.0, period: int = 1):
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}, got {granularity!r}")
        if init is not None and not (np.isfinite(init) and init >= 0):
            raise ValueError(f"init must be a finite number >= 0 or None, got {init}")
        if not a > 0:
            raise ValueError(f"a must be > 0, got {a}")
        if not init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale}")
        if period < 1:
            raise ValueError(f"period must be >= 1, got {period}")
        super().__init__()
        self.granularity = granularity
        self.init = init
        self.a = a
        self.init_scale = init_scale
        self.period = period
        self._residuals: list[np.ndarray] = []
        self._shapes: list[tuple[int, ...]] = []

    @property
    def residuals(self) -> list[np.ndarray]:
        """What was dropped and not yet sent, per layer (in the updates' shapes)."""
        return [r.reshape(s) for r, s in zip(self._residuals, self._shapes)]

    def threshold(self, round: int) -> float:
        """init / t ** (1 / a) with t = 1 + round / period; init must be known (given, or after
        the first encode)."""
        if self.init is None:
            raise ValueError("init is not known before the first encode")
        return self.init / (1 + round / self.period) ** (1.0 / self.a)

    def encode(self, round: int, updates: Sequence[Any]) -> EncodedUpdate:
        flat = self._flat(round, updates)
        shapes = [tuple(np.shape(u)) for u in updates]
        if not self._shapes:
            self._shapes = shapes
            self._residuals = [np.zeros_like(u) for u in flat]
            if self.init is None:
                self.init = self.init_scale * float(np.mean(np.abs(np.concatenate(flat))))
        elif shapes != self._shapes:
            raise ValueError(f"update shapes changed from {self._shapes} to {shapes}")
        thr = self.threshold(round)
        entries: list[Entry] = []
        for i, u in enumerate(flat):
            acc = self._residuals[i] + u
            if self.granularity == "per_layer":
                send = float(np.mean(np.abs(acc))) >= thr
                entries.append(acc if send else None)
                self._residuals[i] = np.zeros_like(acc) if send else acc
                continue
            keep = np.abs(acc) < thr
            count = acc.size - int(keep.sum())
            if 2 * count >= acc.size:  # int32 index + float32 value per element: sparse would be larger
                # dense carries every element (receivers read each one's current value): nothing stays behind
                entries.append(acc.astype(np.float32))
                keep[:] = False
            else:
                idx = np.flatnonzero(~keep).astype(np.int32)
                entries.append((idx, acc[idx]) if count else None)
            self._residuals[i] = np.where(keep, acc, 0.0).astype(np.float32)
        return self._count(pack(entries, sum(u.nbytes for u in flat)))
