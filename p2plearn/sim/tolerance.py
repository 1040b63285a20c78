"""Every virtual peer's loss-tolerance policy, fed what a real peer's synchronizer feeds it.

    tolerance = VirtualTolerance(options, layers, n)     # --tolerance, --loss-bound, --deadline-ms
    tolerance.track(changes, losses)                     # once per round, before its sends
    bounds, deadlines = tolerance.bounds(rnd, sizes, planned_s)
    ... the round's flows ...
    tolerance.observe(rnd, src, delivered, loss, durations, slow, sends_s, sizes)  # what each sender measured

Each peer has its own policy, built by `tolerance.policy_from_options` as a real
peer builds it, its own `NetworkState` (one `RoundRecord` per round: its sends' time, the fraction
that arrived, the receivers' datagram loss, per-receiver delivery rates, whether the deadline or
the slow close cut a send) and `TrainingState` (per round: the update norms per layer and in all, and the round step's
training loss, as `opt.step(loss=...)` passes it). Evaluation accuracies are not reported to the
policies: the phase policy follows its loss path.

What the bounds do on the simulated network is the engine's rule: the first pass goes whole, then
each layer's segment is repaired until 1 - its bound arrived (`sim.Simulator`, `layer_shares`);
a layer then misses min(loss, bound) of its chunks (`layer_delivered`).
"""
from __future__ import annotations

import math

import numpy as np

from p2plearn.options import Options
from p2plearn.tolerance import Layer, NetworkState, RoundRecord, TrainingState, policy_from_options


class VirtualTolerance:
    """The tolerance policies of n virtual peers whose models are flat arrays of `layers` in order."""

    def __init__(self, options: Options, layers: list[Layer], n: int):
        self.layers = layers
        self.policies = [policy_from_options(options) for _ in range(n)]
        self.networks = [NetworkState() for _ in range(n)]
        self.trainings = [TrainingState() for _ in range(n)]
        sizes = np.array([layer.numel for layer in layers])
        self.starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])   # each layer's first element
        nbytes = np.array([layer.nbytes for layer in layers], dtype=float)
        self.shares = nbytes / nbytes.sum()                            # of a message's bytes
        self._deadlines = np.full(n, math.inf)

    @property
    def n(self) -> int:
        return len(self.policies)

    def track(self, changes: np.ndarray, losses: np.ndarray) -> None:
        """The round's training figures: changes [n, P] (each model since its last round) and the
        round step's losses [n]."""
        norms = np.sqrt(np.add.reduceat(np.square(changes, dtype=np.float64), self.starts, axis=1))
        for training, layer_norms, loss in zip(self.trainings, norms.tolist(), losses.tolist()):
            training.record_update(layer_norms)
            training.record_loss(loss)

    def bounds(self, rnd: int, sizes: np.ndarray, planned_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Round `rnd`'s bounds, [n, L] (every peer's per layer), and deadlines [n] (inf: none);
        sizes [n]: each peer's message bytes this round; planned_s: the plan's T."""
        out = np.empty((self.n, len(self.layers)))
        for i, (policy, network, training) in enumerate(zip(self.policies, self.networks, self.trainings)):
            network.expected_bytes = int(sizes[i])
            network.planned_time_s = planned_s
            bounds, deadline = policy.bounds(rnd, self.layers, network, training)
            out[i] = bounds
            self._deadlines[i] = math.inf if deadline is None else deadline
        return out, self._deadlines.copy()

    def layer_delivered(self, flow_src: np.ndarray, flow_loss: np.ndarray, delivered: np.ndarray,
                        bounds: np.ndarray) -> np.ndarray:
        """[F, L]: the fraction of each layer of each flow's message that arrived. A layer whose
        bound is above the loss misses `loss` of it (the first pass only), one below misses its
        bound (repaired to it); a flow the deadline cut (it delivered less than it would whole)
        misses more of every layer, in proportion."""
        whole = 1.0 - np.minimum(flow_loss[:, None], bounds[flow_src])
        expected = whole @ self.shares
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(expected > 0, np.minimum(1.0, delivered / expected), 0.0)
        return whole * scale[:, None]

    def observe(self, rnd: int, src: np.ndarray, delivered: np.ndarray, flow_loss: np.ndarray,
                duration_s: np.ndarray, slow: np.ndarray, sends_s: np.ndarray, sizes: np.ndarray) -> None:
        """What each sender measured of round `rnd`: per flow (sender, delivered fraction, its
        receiver's datagram loss, duration, whether the slow close ended it); per peer, how long its
        sends took and its message's bytes. A flow the deadline or the slow close cut is a deadline
        hit, as in training (`RoundRecord.deadline_hit`)."""
        per_sender: dict[int, list[int]] = {}
        for k, i in enumerate(src.tolist()):
            per_sender.setdefault(i, []).append(k)
        for i, network in enumerate(self.networks):
            flows = per_sender.get(i, [])
            if not flows:
                continue  # a peer that sent nothing measured nothing (as a real one reports no links)
            cut = (np.isfinite(self._deadlines[i]) & (duration_s[flows] >= self._deadlines[i] * (1 - 1e-9))) | \
                (slow[flows] > 0)
            rates = sizes[i] * delivered[flows] / np.maximum(duration_s[flows], 1e-9)
            network.record(RoundRecord(
                round=rnd, elapsed_s=float(sends_s[i]), delivered=float(delivered[flows].mean()),
                loss_rate=float(flow_loss[flows].mean()), delivery_rates=rates.tolist(), deadline_hit=bool(cut.any()),
                message_bytes=int(sizes[i])))
