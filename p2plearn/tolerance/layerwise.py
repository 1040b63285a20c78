"""Per-layer bounds: the loss goes to the layers where it hurts least, at a fixed overall budget."""
from __future__ import annotations

import numpy as np

from p2plearn.tolerance.base import Layer, NetworkState, TolerancePolicy, TrainingState, check_bound

# Sensitivities are floored at this fraction of the largest so that a layer with a zero update
# gets a finite (large) share of the loss instead of a division by zero.
_MIN_SENSITIVITY = 1e-12


class LayerwisePolicy(TolerancePolicy):
    """Each weight layer gets a bound inversely proportional to its sensitivity; biases and
    normalisation parameters get 0; the bytes-weighted delivered fraction is 1 - target_loss.

    Formula, for weight layer i with n_i bytes, e_i elements, depth d_i (0 = input side) and
    update norm g_i (mean of `TrainingState.layer_update_norms` over the last `window` rounds;
    before any is reported g_i = sqrt(e_i), i.e. all layers alike):
        sensitivity  s_i = (g_i / sqrt(e_i)) * (1 + depth_weight * (1 - d_i / max_d))
        bound        b_i = min(max_bound, c / s_i)
    g_i / sqrt(e_i) is the layer's RMS update: losing a fraction b of layer i loses about
    b * g_i^2 of the update's energy, so per byte a layer with a large RMS update hurts more.
    The depth factor protects input-side layers, whose errors propagate through the whole model.
    c >= 0 is solved exactly (water-filling over the sorted sensitivities) so that
        sum_i n_i * b_i = target_loss * (bytes of all layers, biases and norms included).

    Use it when the model's layers differ a lot in size and update magnitude (e.g. a large
    embedding or classifier next to small convolutions): at the same total loss, training
    suffers less than with one uniform bound.

    Args (tuning):
        target_loss: bytes-weighted fraction of the whole model that may be missing, in [0, 1).
            Choose it like the `fixed` policy's bound.
        max_bound: no layer may lose more than this. Must leave room for the target: the weight
            layers' bytes * max_bound >= target_loss * all bytes, or bounds() raises ValueError.
        depth_weight: >= 0; how much more the input-side layers are protected (0 = depth ignored;
            1 = the first layer counts twice as sensitive as the last).
        window: rounds of update norms averaged; longer is steadier against noisy norms.
        deadline_s: fixed round deadline in seconds, None = none (as in `fixed`).
    """

    name = "layerwise"
    reads_update_norms = True

    def __init__(self, target_loss: float = 0.05, max_bound: float = 0.2, depth_weight: float = 0.5,
                 window: int = 5, deadline_s: float | None = None):
        check_bound("target_loss", target_loss)
        check_bound("max_bound", max_bound)
        if depth_weight < 0:
            raise ValueError(f"depth_weight must be >= 0, got {depth_weight}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if deadline_s is not None and deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0 or None, got {deadline_s}")
        self.target_loss = target_loss
        self.max_bound = max_bound
        self.depth_weight = depth_weight
        self.window = window
        self.deadline_s = deadline_s

    def sensitivities(self, layers: list[Layer], training: TrainingState) -> np.ndarray:
        """s_i of every layer (see the class docstring)."""
        numel = np.array([max(layer.numel, 1) for layer in layers], dtype=float)
        recent = training.layer_update_norms[-self.window:]
        if recent:
            if any(len(row) != len(layers) for row in recent):
                raise ValueError(f"layer_update_norms rows must have one norm per layer ({len(layers)})")
            norms = np.mean(np.asarray(recent, dtype=float), axis=0)
        else:
            norms = np.sqrt(numel)
        depth = np.array([layer.depth for layer in layers], dtype=float)
        max_depth = depth.max(initial=0.0)
        rel_depth = depth / max_depth if max_depth > 0 else np.zeros_like(depth)
        s = norms / np.sqrt(numel) * (1.0 + self.depth_weight * (1.0 - rel_depth))
        return np.maximum(s, _MIN_SENSITIVITY * max(s.max(initial=0.0), _MIN_SENSITIVITY))

    def bounds(self, round: int, layers: list[Layer], network: NetworkState,
               training: TrainingState) -> tuple[list[float], float | None]:
        out = np.zeros(len(layers))
        weights = np.array([i for i, layer in enumerate(layers) if layer.kind == "weight"], dtype=int)
        nbytes = np.array([layer.nbytes for layer in layers], dtype=float)
        budget = self.target_loss * nbytes.sum()
        capacity = self.max_bound * nbytes[weights].sum()
        if budget > capacity * (1 + 1e-12):
            raise ValueError(f"target_loss={self.target_loss} needs {budget:.0f} lost bytes but the weight "
                             f"layers can lose at most {capacity:.0f} at max_bound={self.max_bound}; "
                             "raise max_bound or lower target_loss")
        if budget > 0:
            out[weights] = self._water_fill(nbytes[weights], self.sensitivities(layers, training)[weights], budget)
        return out.tolist(), self.deadline_s

    def _water_fill(self, n: np.ndarray, s: np.ndarray, budget: float) -> np.ndarray:
        """b = min(max_bound, c / s) with sum(n * b) = budget; the least sensitive layers saturate first."""
        order = np.argsort(s)
        n, s = n[order], s[order]
        b = np.full(len(n), self.max_bound)
        for m in range(len(n)):  # m = how many of the least sensitive layers sit at max_bound
            c = (budget - self.max_bound * n[:m].sum()) / (n[m:] / s[m:]).sum()
            if c <= self.max_bound * s[m]:
                b[m:] = c / s[m:]
                break
        out = np.empty(len(n))
        out[order] = b
        return out
