"""The outer update on a round's averaged change, as DiLoCo makes it.

Between rounds each peer takes its local steps; a round averages the peers' models. The outer
update then treats the averaged change since the last round as a (negative) gradient:

    change = merged - anchor          # anchor: this peer's model right after the last round
    buffer = momentum * buffer + change
    model  = anchor + lr * (change + momentum * buffer)      # Nesterov

With lr 1 and momentum 0 the model is the plain average (the update is skipped). Tuning: with a
long period (tens to hundreds of local steps) DiLoCo's lr 0.7 and momentum 0.9 speed up
convergence; with a short period momentum adds little and lr above 1 can diverge. With
``--fragments`` each round steps its fragment's parameters only, each with its own momentum.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from p2plearn.sync.bfloat16 import store, values


class OuterOptimizer:
    """Nesterov SGD on the averaged change, in float32 (float64 for float64 parameters).

    Args:
        lr: outer step size (> 0); 1 keeps the average as it is.
        momentum: Nesterov momentum in [0, 1).
    """

    def __init__(self, lr: float = 1.0, momentum: float = 0.0) -> None:
        if lr <= 0 or not 0.0 <= momentum < 1.0:
            raise ValueError(f"outer lr must be > 0 and momentum in [0, 1), got {lr} and {momentum}")
        self.lr = lr
        self.momentum = momentum
        self.buffers: list[np.ndarray] | None = None  # one per parameter, made at the first step

    @property
    def plain(self) -> bool:
        """Whether the update leaves the average as it is (lr 1, no momentum)."""
        return self.lr == 1.0 and self.momentum == 0.0

    def step(self, params: list[np.ndarray], anchors: list[np.ndarray], only: Sequence[int] | None = None) -> None:
        """`params` hold the round's merged model; each becomes its outer update from `anchors`.
        `only`: the indices of the parameters the round carried (a fragment): the others, and
        their momentum, are left as they are; None: all."""
        if self.plain:
            return
        if self.buffers is None:
            self.buffers = [np.zeros(p.shape, np.float64 if p.dtype == np.float64 else np.float32) for p in params]
        for i in range(len(params)) if only is None else only:
            p, anchor, buffer = params[i], anchors[i], self.buffers[i]
            change = values(p).astype(buffer.dtype) - values(anchor)
            if self.momentum:
                buffer *= self.momentum
                buffer += change
                change += self.momentum * buffer
            store(p, values(anchor) + self.lr * change)

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": None if self.buffers is None else [b.copy() for b in self.buffers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        buffers = state.get("buffers")
        self.buffers = None if buffers is None else [np.array(b) for b in buffers]
