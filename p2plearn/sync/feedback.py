"""A partitioned aggregator's error feedback: float32 per element of the part it aggregates.

A compressed partitioned round's gather sends each aggregator's averaged part with error feedback
of its own (see `p2plearn.sync.partitioned`). That residual is kept for the pieces this peer
aggregates only, so it costs a part's memory, not a model's. When a layout cuts an array anew (a
view with other bandwidths), what stays in this peer's part keeps its residual and what joins it
starts at zero; what leaves it is dropped (its new aggregator sends it from then on). Nothing is
written where this peer does not aggregate: pages of the model's size are never touched.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from p2plearn.sync.compress import Piece
from p2plearn.sync.layout import Slices


class PartFeedback:
    """Residuals per piece of this peer's part, carried across rounds and layouts."""

    def __init__(self) -> None:
        self.pieces: dict[Piece, np.ndarray] = {}  # owned here; read and updated in place by the encoder

    def residuals(self, slices: Slices) -> list[np.ndarray]:
        """The residuals of the pieces ``slices`` (this round's part), in order. Pieces of the same
        arrays cut otherwise before are replaced by these, with their overlap carried."""
        if any(piece not in self.pieces for piece in slices):
            arrays = {t for t, _, _ in slices}
            before = {p: r for p, r in self.pieces.items() if p[0] in arrays}
            for p in before:
                del self.pieces[p]
            for t, a, b in slices:
                residual = self.pieces[(t, a, b)] = np.zeros(b - a, dtype=np.float32)
                for (u, c, d), kept in before.items():
                    lo, hi = max(a, c), min(b, d)
                    if u == t and lo < hi:
                        residual[lo - a:hi - a] = kept[lo - c:hi - c]
        return [self.pieces[piece] for piece in slices]

    def forget(self, slices: Slices) -> None:
        """Zero the residuals of ``slices`` (a resync round sent values, which carry what they held)."""
        for piece in slices:
            if piece in self.pieces:
                self.pieces[piece].fill(0.0)

    def state_dict(self) -> dict[str, Any]:
        return {"pieces": [list(p) for p in self.pieces], "residuals": [r.copy() for r in self.pieces.values()]}

    def load_state_dict(self, state: dict[str, Any], sizes: list[int]) -> None:
        """The residuals saved by `state_dict` (pieces of arrays of ``sizes`` elements); a state
        without "pieces" (one residual per whole array) is read as such pieces."""
        residuals = [np.asarray(r, dtype=np.float32).reshape(-1) for r in state["residuals"]]
        whole = [(t, 0, r.size) for t, r in enumerate(residuals)]
        pieces = [tuple(int(x) for x in p) for p in state.get("pieces", whole)]
        if len(pieces) != len(residuals):
            raise ValueError(f"the gather's error feedback names {len(pieces)} pieces for {len(residuals)} residuals")
        for (t, a, b), r in zip(pieces, residuals):
            if not 0 <= t < len(sizes) or not 0 <= a <= b <= sizes[t] or r.size != b - a:
                raise ValueError(f"the gather's error feedback holds elements {a}:{b} of array {t} in {r.size} "
                                 f"values, not a piece of this run's arrays of {sizes} elements")
        self.pieces = {p: r.copy() for p, r in zip(pieces, residuals)}
