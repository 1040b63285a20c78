"""Robust merging: what one lying member can do to a receiver's model, bounded (`native/robust.c`).

A member holds the job's secret, so its messages authenticate; it can still send a model that is
sign-flipped, scaled, noisy or stale. The plain merge averages it in like any other. `RobustMerge`
merges with the same masks, formats and non-finite refusals (`sync.merge.Contribution`), but:

- ``clip`` (centered clipping; CenteredClip, Karimireddy et al. 2021, "Learning from History for
  Byzantine Robust Optimization"; ClippedGossip, He et al. 2022, "Byzantine-robust decentralized
  learning via ClippedGossip"): tile by tile (1024 elements), a sender whose difference from the
  receiver's own values is over RADIUS times the typical distance (the median, per tile, of the
  senders' RMS distances in this merge and the last HISTORY merges of this tensor) is scaled down to
  the typical distance (to RADIUS times it, for a RADIUS under 1). A clipped sender moves a receiver
  no further than a typical honest one, whatever it sends (scaled down to the radius, it would keep
  up to RADIUS times that pull); honest senders within the radius are untouched. Tune with
  ``--robust-radius``: it decides who is clipped; lower clips more honest senders (at 2, under 1% of
  honest merges in experiments/results/attacks_sim.md).
- ``trimmed``: each element the mean of its own value and the values that arrived, less the
  largest and smallest ``TRIM`` (1): needs 2 x TRIM + 2 senders (4); a merge with fewer clips.

Both refuse a value that is not finite in every format (`Contribution.finite_only` for all: a NaN
would pass any radius), counted in each contribution's ``nonfinite``; ``--keep-nonfinite`` does not
apply. Per sender (`stats`): merges it took part in, those where it was clipped (more than half of its
elements in clipped tiles, or trimmed), and the mean share of its distance that was cut. With
``exclude``, a sender clipped in more than half of at least EXCLUDE_AFTER merges is not merged
again (one log line; counted in ``stats()["excluded"]``).
"""
from __future__ import annotations

import logging
from collections import defaultdict, deque

import numpy as np

from p2plearn.compute import check, ffi, lib
from p2plearn.sync.merge import Contribution, _code, _describe

log = logging.getLogger("p2plearn.sync")

MODES = ("none", "clip", "trimmed")
HISTORY = 16        # past merges of a tensor whose tile medians set the radius (with this merge's)
TRIM = 1            # --robust trimmed: values dropped at each end, per element
EXCLUDE_AFTER = 8   # merges a sender must have been seen in before it can be excluded


class RobustMerge:
    """One receiver's robust merge and its per-sender record (see the module's doc).

    Owned by the thread that merges (the synchronizer's round); not thread-safe.
    """

    def __init__(self, mode: str, radius: float = 2.0, exclude: bool = False):
        if mode not in MODES[1:]:
            raise ValueError(f"robust merge: mode must be one of {', '.join(MODES[1:])}, got {mode!r}")
        if not radius > 0:
            raise ValueError(f"robust merge: the radius must be > 0, got {radius}")
        self.mode, self.radius, self.exclude = mode, radius, exclude
        self._history: dict[object, deque[np.ndarray]] = {}  # per tensor key: its last merges' tile medians
        self.merges: defaultdict[int, int] = defaultdict(int)   # per sender: merges it took part in
        self.clipped: defaultdict[int, int] = defaultdict(int)  # ... of them, where it was clipped
        self._cut: defaultdict[int, float] = defaultdict(float)  # ... the sum of its distance's share cut
        self.excluded: set[int] = set()

    def merge_parameter(self, key: object, own: np.ndarray, contributions: list[Contribution],
                        senders: list[int]) -> float:
        """Merge `contributions` (from `senders`, one each) into `own` in place, robustly; `key` names
        the tensor (its radius history). Returns the fraction of (element, sender) pairs that counted,
        and sets each contribution's `nonfinite`, as `sync.merge.merge_parameter` does."""
        kept = [(c, s) for c, s in zip(contributions, senders) if s not in self.excluded]
        if not kept:
            return 1.0
        if not own.flags.c_contiguous:
            raise ValueError("merge needs a C-contiguous parameter")
        tiles = -(-own.size // lib.P2P_ROBUST_TILE)
        trimmed = self.mode == "trimmed" and len(kept) >= 2 * TRIM + 2
        how = ffi.new("p2p_robust *")
        how.mode = lib.P2P_ROBUST_TRIMMED if trimmed else lib.P2P_ROBUST_CLIP
        how.multiplier, how.trim = self.radius, TRIM
        history = self._history.setdefault(key, deque(maxlen=HISTORY))
        if history and history[0].size != tiles:
            history.clear()  # another tensor under the same key
        past = np.ascontiguousarray(np.array(history, dtype=np.float64).reshape(len(history), tiles))
        medians = np.empty(tiles, dtype=np.float64)
        how.history, how.nhistory = ffi.from_buffer("double[]", past), len(history)
        how.tile_median_out = ffi.from_buffer("double[]", medians)
        structs = ffi.new("p2p_contribution[]", len(kept))
        keep: list[np.ndarray] = []  # the buffers the structs point into, alive until the call returns
        for s, (c, _) in zip(structs, kept):
            _describe(s, own, c, keep)
            s.finite_only = 1  # a NaN or inf is a lie too, in any format: refused, as a lost value
        out = ffi.new("p2p_robust_sender[]", len(kept))
        check(lib.p2p_robust_merge(ffi.from_buffer(own), _code(own), own.size, structs, len(kept), how, out))
        if not trimmed:
            history.append(medians)
        arrived = 0
        for (c, sender), o in zip(kept, out):
            c.nonfinite = int(o.refused)
            arrived += int(o.arrived)
            self._record(sender, o)
        return arrived / (own.size * len(kept)) if own.size else 1.0

    def _record(self, sender: int, o) -> None:
        """Count one merge of `sender` (o: its p2p_robust_sender) and exclude it when it is due."""
        self.merges[sender] += 1
        if o.arrived and 2 * o.clipped > o.arrived:
            self.clipped[sender] += 1
        if o.distance2 > 0:
            self._cut[sender] += 1.0 - float(np.sqrt(o.kept2 / o.distance2))
        if self.exclude and sender not in self.excluded and self.merges[sender] >= EXCLUDE_AFTER \
                and 2 * self.clipped[sender] > self.merges[sender]:
            self.excluded.add(sender)
            log.warning("robust merge: rank %d was clipped in %d of its %d merges: not merged from again "
                        "(--robust-exclude)", sender, self.clipped[sender], self.merges[sender])

    def stats(self) -> dict:
        """Per sender: merges, clipped (merges where it was), cut (the mean share of its distance
        from this peer's model that the merge cut); and the excluded senders."""
        return {"mode": self.mode, "radius": self.radius, "excluded": sorted(self.excluded),
                "senders": {s: {"merges": m, "clipped": self.clipped[s], "cut": self._cut[s] / m}
                            for s, m in sorted(self.merges.items())}}


def combined_stats(merges: list[RobustMerge]) -> dict:
    """Several receivers' records together (the simulator's peers): per sender, its merges, those
    where it was clipped, and the receivers that excluded it."""
    senders: dict[int, dict] = {}
    for receiver, robust in enumerate(merges):
        for s, record in robust.stats()["senders"].items():
            row = senders.setdefault(s, {"merges": 0, "clipped": 0, "excluded_by": []})
            row["merges"] += record["merges"]
            row["clipped"] += record["clipped"]
        for s in robust.excluded:
            senders.setdefault(s, {"merges": 0, "clipped": 0, "excluded_by": []})["excluded_by"].append(receiver)
    return {"mode": merges[0].mode, "radius": merges[0].radius, "senders": dict(sorted(senders.items()))}


def robust_merge(options) -> RobustMerge | None:
    """The receiver's robust merge the options ask for (``--robust``), or None for the plain merge."""
    if options.robust == "none":
        return None
    return RobustMerge(options.robust, options.robust_radius, options.robust_exclude)
