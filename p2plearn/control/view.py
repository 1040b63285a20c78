"""GlobalView: what the coordinator knows of every peer, as numpy arrays indexed by rank."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import protocol as p

_ARRAYS = ("uplink", "downlink", "uplink_target", "downlink_target", "uplink_age", "downlink_age",
           "uplink_noise", "downlink_noise", "compute_s", "merge_s", "backlog", "in_flight_bytes",
           "in_flight_msgs", "alive", "clock", "message_bytes", "mcast_domain")
_DTYPES = {"alive": np.bool_, "clock": np.int64, "mcast_domain": np.int64}
_SIGNED = ("uplink_age", "downlink_age", "uplink_noise", "downlink_noise")  # the arrays that may be negative
UNICAST_ONLY = -1  # mcast_domain of a peer that shares a multicast domain with nobody
# What a plan (and its pacing and probes) depends on: a new version only when one of these changes
# materially. A new version costs a round of risk (a peer that has not received it yet plans with
# the old one, and the two plans disagree), so noise must not make one: an input changes when it
# moves by more than CHANGE of its published value plus the floor of its unit. Tuning: a larger
# CHANGE keeps views steadier and plans further from the estimates (a burst moves a rate by far
# more than 10%).
PLANNING_INPUTS = ("uplink", "downlink", "uplink_target", "downlink_target", "compute_s", "merge_s", "backlog",
                   "in_flight_bytes", "alive", "message_bytes", "mcast_domain")
CHANGE = 0.1
FLOOR = {"compute_s": 0.005, "merge_s": 0.005, "backlog": 1.0, "in_flight_bytes": 65536.0}
EXACT = ("alive", "message_bytes", "mcast_domain")


def domains_from_reach(reach: Mapping[int, Collection[int]], size: int) -> np.ndarray:
    """Multicast domain labels from the peers' probe reports: ``reach[i]``, the ranks that peer i's
    multicast probe reached (``Channel.probe_multicast``), for every peer that reported.

    A domain is a set of peers of which each reached every other one (both ways: a pair reached one
    way only is not in one domain), labelled by its smallest rank; a peer in no domain of two or
    more is ``UNICAST_ONLY``. Conservative and deterministic: in rank order, each peer not yet in a
    domain starts one and takes in, in rank order, every peer not yet in one that it and all the
    domain's members reach both ways. Where reach is an equivalence (one LAN, or several LANs that
    multicast does not cross) this finds exactly its classes; elsewhere (A-B and B-C but not A-C) a
    peer stays in the first domain that takes it and is sent to by unicast from the others, which
    costs uplink copies, never a message.
    """
    mutual = {i: {j for j in reach[i] if j != i and i in reach.get(j, ())} for i in reach if 0 <= i < size}
    domain = np.full(size, UNICAST_ONLY, dtype=np.int64)
    for i in sorted(mutual):
        if domain[i] != UNICAST_ONLY:
            continue
        members = [i]
        for j in sorted(mutual[i]):
            if 0 <= j < size and domain[j] == UNICAST_ONLY and all(j in mutual[k] for k in members):
                members.append(j)
        if len(members) > 1:
            domain[members] = i
    return domain


def reach_of(domain: np.ndarray) -> dict[int, set[int]]:
    """The reach that ``domains_from_reach`` makes ``domain`` from (a successor coordinator takes
    over a view's domains this way, before the peers' own reports)."""
    return {i: {j for j in np.flatnonzero(domain == d).tolist() if j != i}
            for i, d in enumerate(domain.tolist()) if d != UNICAST_ONLY}


@dataclass(frozen=True)
class GlobalView:
    """A snapshot of the job, one entry per rank (a rank never seen is not ``alive``).

    - ``uplink`` / ``downlink``: estimated available bandwidth, wire bytes/s (see BandwidthEstimator);
      ``*_target``: the rate the end's next probe offers (bytes/s); ``*_age``: rounds since the last
      sample; ``*_noise``: relative deviation of recent samples (the estimates' uncertainty);
    - load, from each peer's latest report: ``compute_s``, seconds of local work before its send
      (its training step); ``merge_s``, seconds to merge one message; ``backlog``, messages it
      received and has not merged yet; ``in_flight_bytes`` / ``in_flight_msgs``, what it is
      still receiving (see ``NetworkView.from_global`` for how load enters a plan);
    - ``alive``: bool mask of live members;
    - ``clock``: each peer's last reported clock (rounds completed);
    - ``message_bytes``: the size of each peer's last message (0: not known yet);
    - ``mcast_domain``: each peer's IP multicast domain (``domains_from_reach``): peers sharing a
      label >= 0 reach each other through one copy on the sender's uplink; ``UNICAST_ONLY`` (-1)
      shares one with nobody, or did not report (only ``--transport-mode auto`` probes and reports;
      see ``sync.planner`` for what each mode plans with). None: -1 everywhere;
    - ``round``: the slowest live peer's clock when the snapshot was taken.

    Every peer plans its rounds from the view it holds, so that no step asks anyone. ``term`` (the
    coordinator's incarnation) and ``version`` order views; the version changes only when a
    planning input changes, and a new version applies from round ``from_round`` on, a little ahead
    of the fastest peer, so that every peer switches to it at the same round.
    """

    round: int
    uplink: np.ndarray
    downlink: np.ndarray
    uplink_target: np.ndarray
    downlink_target: np.ndarray
    uplink_age: np.ndarray
    downlink_age: np.ndarray
    uplink_noise: np.ndarray
    downlink_noise: np.ndarray
    compute_s: np.ndarray
    merge_s: np.ndarray
    backlog: np.ndarray
    in_flight_bytes: np.ndarray
    in_flight_msgs: np.ndarray
    alive: np.ndarray
    clock: np.ndarray
    message_bytes: np.ndarray
    mcast_domain: np.ndarray | None = None
    term: int = 0
    version: int = 0
    from_round: int = 0

    def __post_init__(self) -> None:
        if self.mcast_domain is None:
            object.__setattr__(self, "mcast_domain", np.full(len(self.alive), UNICAST_ONLY, dtype=np.int64))

    @property
    def size(self) -> int:
        return len(self.alive)

    @property
    def order(self) -> tuple[int, int, int]:
        """Sort key: which of two views is newer."""
        return (self.from_round, self.term, self.version)

    def plans_like(self, other: GlobalView | None) -> bool:
        """Whether ``other``'s planning inputs are this view's, up to changes that are not material
        (see CHANGE): then ``other``, already published, goes on planning."""
        if other is None or other.size != self.size:
            return False
        for name in PLANNING_INPUTS:
            new, old = getattr(self, name), getattr(other, name)
            if name in EXACT:
                if not np.array_equal(new, old):
                    return False
            elif (np.abs(new - old) > CHANGE * np.abs(old) + FLOOR.get(name, 0.0)).any():
                return False
        return True

    def to_blobs(self) -> tuple[dict, list[bytes]]:
        """Header and raw frames for the wire (no JSON of large arrays)."""
        arrays = [np.ascontiguousarray(getattr(self, name), dtype=_DTYPES.get(name, np.float64)) for name in _ARRAYS]
        header = {"round": self.round, "size": self.size, "term": self.term, "version": self.version,
                  "from_round": self.from_round}
        return header, [a.tobytes() for a in arrays]

    @classmethod
    def from_blobs(cls, header: Any, blobs: list[bytes]) -> GlobalView:
        """Raises ``protocol.BadField`` (a ValueError) on a malformed view: a header that is not
        one, arrays of the wrong size, values no planner can use (NaN, infinite, negative rates,
        domains that are no rank)."""
        if not isinstance(header, dict):
            raise p.BadField(f"a view header must be an object, got {str(header)[:60]}")
        if len(blobs) != len(_ARRAYS):
            raise p.BadField(f"GlobalView needs {len(_ARRAYS)} arrays, got {len(blobs)}")
        size = p.integer(header.get("size"), "view size", 0, p.MAX_RANK + 1)
        arrays = {}
        for name, blob in zip(_ARRAYS, blobs):
            dtype = np.dtype(_DTYPES.get(name, np.float64))
            if len(blob) != size * dtype.itemsize:
                raise p.BadField(f"GlobalView array {name} has {len(blob)} bytes, expected {size * dtype.itemsize}")
            arrays[name] = np.frombuffer(blob, dtype=np.uint8 if name == "alive" else dtype)
        if (arrays["alive"] > 1).any():
            raise p.BadField("GlobalView alive holds values other than 0 and 1")
        arrays["alive"] = arrays["alive"].view(np.bool_)
        for name in _ARRAYS:
            low = -1 if name == "mcast_domain" else -np.inf if name in _SIGNED else 0
            if not (np.isfinite(arrays[name]) & (arrays[name] >= low)).all():
                raise p.BadField(f"GlobalView array {name} holds values that are not finite numbers >= {low}")
        if (arrays["mcast_domain"] >= size).any():
            raise p.BadField("GlobalView mcast_domain names a rank beyond the view")
        return cls(round=p.integer(header.get("round"), "view round"), term=p.integer(header.get("term", 0), "term"),
                   version=p.integer(header.get("version", 0), "view version"),
                   from_round=p.integer(header.get("from_round", 0), "view from_round"), **arrays)


class ViewHistory:
    """The views a peer holds, by ``order`` (the newest last, at most ``kept``), and the one that plans
    a round: the newest that applies from that round or before (every peer holding the same views
    picks the same one). What a control client keeps of the pushed views, and what the simulator's
    virtual peers keep of the coordinator's (`p2plearn.sim.control`). Not thread-safe: its owner locks.

    Tuning: ``kept`` bounds memory; a new version applies a few rounds ahead (the coordinator's
    ``VIEW_LEAD``), so a few views suffice."""

    def __init__(self, kept: int = 16) -> None:
        self.kept = kept
        self._views: list[GlobalView] = []

    def add(self, view: GlobalView) -> None:
        """Hold ``view``, replacing one of its order."""
        views = [v for v in self._views if v.order != view.order] + [view]
        views.sort(key=lambda v: v.order)
        self._views = views[-self.kept:]

    @property
    def newest(self) -> GlobalView | None:
        return self._views[-1] if self._views else None

    def for_round(self, round: int) -> GlobalView | None:
        """The view that plans ``round`` (before any applies: the oldest held; None: none held)."""
        usable = [v for v in self._views if v.from_round <= round]
        return usable[-1] if usable else (self._views[0] if self._views else None)
