"""Per-peer estimates of available bandwidth, seeded from a topology, corrected by what receivers saw.

Units: every rate here is in wire bytes/s, frames as a link counts them (the topology's rates, the
pacing rates and the engine's ACK-based rates alike).

The estimator (documented here because selection relies on its behaviour):

- Seed: ``uplink[i]`` / ``downlink[i]`` from the topology when one is given, else the line rate of
  the interface peer ``i`` registered from (``p2plearn.transport.nic``: a NIC's negotiated speed,
  10 Gbit/s on loopback), else ``default_rate``. The seed is also the end's *line* rate.
- Every round each sender reports, per receiver ``j``: ``paced`` (the rate it paced the flow at,
  0 = unpaced) and ``rate`` (the engine's ACK-based delivery rate: what arrived at ``j`` in the
  first pass, timed by the spread of ``j``'s ACKs; 0 when the transfer was too short to time).
  A flow is *limited* when ``rate < LIMITED * paced``: the network, not our pacing, set its pace.
- Once every live peer has reported a round (``close_round``), every end gets one sample from
  that round's measured flows: the uplink of ``i`` the sum of ``rate[i, j]`` over its flows, the
  flows through its IP multicast group (``multicast`` in the report) counted once, at the highest
  rate a member saw (the group is one copy on the uplink: summed, a group of k would say the
  uplink carried k times what it did); the downlink of ``j`` the sum of ``rate[i, j]`` over its
  incoming flows (a group goes at its slowest member's pace, so of a group's flows only the
  slowest member's may put a limit on its downlink) (the flows of a round run
  at about the same time; senders far apart in time overstate a downlink's sum until its flows
  are limited again, which then corrects it).
- Which end a limited flow is put on: a probe (see below) on the end it probed, unless the other
  end carried LIMITED of its estimate or more (the probe overfilled it, which says nothing of the
  probed end); another flow on the end of it that was limited with more partners (the other
  end's limit explains it), on both if as many. Such an ambiguous sample (p = 1 plans leave one
  flow per end) waits for the end's next one and counts only if that one is a bottleneck too;
  then both count, so a slow end still falls within 3 rounds and an innocent partner keeps its
  estimate (an end already limited takes it at once). This keeps one slow receiver from
  lowering its senders' uplinks (it is limited with all of them, each of them with one
  receiver) and one slow sender from lowering its receivers' downlinks.
- When the flows put on an end carried more than half of what it was offered (by their paces),
  the end was their shared bottleneck and the sample is its rate: the estimate moves towards it
  by ``alpha``, down or up. Otherwise the end carried at least the sample: the estimate rises to
  it at once and never falls.
- Pacing runs at 0.95 of the plan's share, so without probes a sample never exceeds the
  estimate. Each end has a probe *target*, the rate its next probe offers (the planner plans and
  paces a probed end at it, see ``selection.view.NetworkView.probed``): the line rate at first;
  each bottleneck sample brings it halfway down to the estimate, never below ``PROBE_FLOOR``
  times the estimate nor above the line rate (a link that stays slow is probed ever more gently);
  a sample that raises the estimate sends it back to the line rate (a link that came back may
  have come back whole). An end whose age (below) exceeds ``STALE_ROUNDS`` (a peer too slow to
  be given a message gets no sample) is probed at its line rate.
- Uncertainty per end, in the view: ``age`` (rounds since a sample last tested the estimate: a
  bottleneck, or one that raised it; the seed counts as round -1) and ``noise`` (an EWMA, weight
  ``NOISE_ALPHA``, of |sample - estimate| / estimate over bottleneck samples).

Tuning: ``alpha`` (0..1] trades reaction speed against noise: at 0.8 what is left of a sustained
drop after 3 rounds is 0.2^3 of it (a link down to a fifth is then estimated 3% high; at 0.3 it
would be 34% of the drop); ``LIMITED`` must sit below the ratio of ACK-timed to paced rate that
an uncongested link shows (1.0 where the hosts keep up with the pace) and above what a congested
link delivers; ``STALE_ROUNDS`` trades how soon a peer too slow to be sent anything is probed
again against what probing a link that stays slow costs; ``default_rate`` only matters for a
peer without a topology entry whose interface does not report a speed (virtual NICs, Wi-Fi).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

LIMITED = 0.8        # a flow that delivered below this fraction of its pace met a bottleneck
NOISE_ALPHA = 0.2    # EWMA weight of a new bottleneck sample's relative deviation
PROBE_FLOOR = 1.25   # a probe offers at least this times the estimate (BBR's probing gain)
STALE_ROUNDS = 2     # an end unmeasured for more rounds than this is probed at its line rate


def seed_rates(topology: Any) -> dict[int, tuple[float, float]]:
    """``{rank: (uplink, downlink)}`` in bytes/s from a topology.

    Accepts a mapping ``{rank: {"uplink": u, "downlink": d}}`` or ``{rank: (u, d)}``, or a
    ``p2plearn.topology.Topology`` (ranks follow its peers in file order; a node with ``slots``
    peers gives that many consecutive ranks its rates, as the launcher places them).
    """
    if isinstance(topology, Mapping):
        out = {}
        for rank, rates in topology.items():
            up, down = (rates["uplink"], rates["downlink"]) if isinstance(rates, Mapping) else rates
            out[int(rank)] = (float(up), float(down))
        return out
    if hasattr(topology, "uplink_bytes_per_s"):
        rates = [(topology.uplink_bytes_per_s(peer), topology.downlink_bytes_per_s(peer))
                 for peer in topology.peers for _ in range(topology.slots(peer))]
        return dict(enumerate(rates))
    raise TypeError(f"cannot read per-peer uplink/downlink from {type(topology).__name__}")


def rates_from_file(path: str) -> dict[int, tuple[float, float]]:
    """``seed_rates`` of the topology file at ``path`` (read by ``p2plearn.topology.load``)."""
    from p2plearn.topology import load  # only jobs with a topology need it

    return seed_rates(load(path))


@dataclass
class LinkEstimate:
    """One end (a peer's uplink or downlink): its estimate and how much to trust it."""

    rate: float             # wire bytes/s
    line: float             # the seed, or the highest estimate since
    target: float = 0.0     # what the next probe offers (0: the line rate)
    tested: int = -1        # round of the last sample that tested the estimate (-1: the seed)
    noise: float = 0.0      # EWMA of |sample - estimate| / estimate
    pending: float = 0.0    # an ambiguous bottleneck sample waiting for a second one (0: none)
    limited: bool = False   # the last sample was a bottleneck

    def __post_init__(self) -> None:
        self.target = self.target or self.line

    def sample(self, value: float, bottleneck: bool, round: int, alpha: float, ambiguous: bool = False) -> None:
        if bottleneck or value > self.rate:
            self.tested = round  # a flow at its pace below the estimate tested nothing
        if bottleneck and ambiguous and not (self.limited or self.pending):
            self.pending = value  # the partner may be the one to blame: wait for another round
            return
        if bottleneck and self.pending:
            self._bottleneck(self.pending, alpha)
        self.pending = 0.0
        self.limited = bottleneck
        if bottleneck:
            self._bottleneck(value, alpha)
        elif value > self.rate:
            self.rate = value
            self.target = self.line
        self.line = max(self.line, self.rate)
        self.target = max(self.target, self.rate)

    def _bottleneck(self, value: float, alpha: float) -> None:
        self.noise += NOISE_ALPHA * (abs(value - self.rate) / self.rate - self.noise)
        self.rate += alpha * (value - self.rate)
        self.target = min(self.line, max(PROBE_FLOOR * self.rate, (self.target + self.rate) / 2))


def _one_per_group(src: np.ndarray, rate: np.ndarray, group: np.ndarray, better) -> np.ndarray:
    """Per flow: every unicast flow, and of each sender's group flows the one whose rate is
    `better` (np.greater: the highest, np.less: the lowest) than the others'."""
    keep = ~group
    best: dict[int, int] = {}
    for k in np.flatnonzero(group).tolist():
        if int(src[k]) not in best or better(rate[k], rate[best[int(src[k])]]):
            best[int(src[k])] = k
    keep[list(best.values())] = True
    return keep


class BandwidthEstimator:
    """Bandwidth estimates per rank (see the module docstring for the rules).

    ``rates``: seed from ``seed_rates``; ``default_rate``: bytes/s assumed for a rank with no
    seed (1.25e8 = 1 Gbit/s); ``alpha``: how far a bottleneck sample moves the estimate.
    """

    def __init__(self, rates: Mapping[int, tuple[float, float]] | None = None, *,
                 default_rate: float = 1.25e8, alpha: float = 0.8) -> None:
        self.default_rate = default_rate
        self.alpha = alpha
        self.uplink: dict[int, LinkEstimate] = {r: LinkEstimate(up, up) for r, (up, _) in (rates or {}).items()}
        self.downlink: dict[int, LinkEstimate] = {r: LinkEstimate(d, d) for r, (_, d) in (rates or {}).items()}
        # round -> flows: (sender, receiver, paced, rate, probes the uplink, probes the downlink, via the group)
        self._flows: dict[int, list[tuple[int, int, float, float, bool, bool, bool]]] = defaultdict(list)
        self._closed = 0  # rounds closed so far (ages count from it)

    def observe(self, sender: int, round: int, links: Mapping[int, Mapping[str, float]]) -> None:
        """One sender's flows of one round: ``links[receiver]`` has ``paced`` and ``rate`` (bytes/s),
        ``probe``: the end(s) the flow probed ("uplink", "downlink", both or ""), and ``multicast``:
        whether it went through the sender's group (one copy on the uplink for all such flows)."""
        flows = self._flows[round]
        for j, s in links.items():
            rate, paced, probe = float(s.get("rate", 0.0)), float(s.get("paced", 0.0)), str(s.get("probe", ""))
            if 0 < rate < np.inf and 0 <= paced < np.inf:  # rate 0: too short to time
                flows.append((sender, int(j), paced, rate, "uplink" in probe, "downlink" in probe,
                              s.get("multicast") is True))

    def close_round(self, round: int) -> None:
        """Every live peer has reported ``round``: apply the samples of every round up to it."""
        for r in sorted(r for r in self._flows if r <= round):
            flows = self._flows.pop(r)
            if not flows:
                continue
            src, dst, paced, rate, probe_up, probe_down, group = (np.array(c) for c in zip(*flows))
            size = int(max(src.max(), dst.max())) + 1
            copy = _one_per_group(src, rate, group, np.greater)  # the uplink carried one copy per group
            # Every member of a group gets the pace of its slowest one: only that one's limit may be
            # its own downlink's (the others took what the group sent).
            blamable = _one_per_group(src, rate, group, np.less)
            limited = rate < LIMITED * np.where(paced > 0, paced, np.inf)
            offered = np.where(paced > 0, paced, rate)  # unpaced: what it took
            # A probe's limit is put on the end it probed, unless the other end was full (the probe
            # overfilled it: that says nothing of the probed end); another limited flow on the end
            # limited with more partners (on both if as many).
            probe = probe_up | probe_down
            plain = limited & ~probe
            up_count = np.bincount(src, weights=plain & copy, minlength=size)
            down_count = np.bincount(dst, weights=plain & blamable, minlength=size)
            up_full = np.bincount(src, weights=rate * copy, minlength=size) >= LIMITED * self._rates(self.uplink, size)
            down_full = np.bincount(dst, weights=rate, minlength=size) >= LIMITED * self._rates(self.downlink, size)
            up_blamed = (plain & (up_count[src] >= down_count[dst])) | (limited & probe_up & ~down_full[dst])
            down_blamed = blamable & ((plain & (down_count[dst] >= up_count[src]))
                                      | (limited & probe_down & ~up_full[src]))
            tie = (up_count[src] == down_count[dst]) & ~probe
            every = np.ones(len(src), dtype=bool)
            for table, ends, blamed, counted in ((self.uplink, src, up_blamed, copy),
                                                 (self.downlink, dst, down_blamed, every)):
                total = np.bincount(ends, weights=rate * counted, minlength=size)
                half = np.bincount(ends, weights=offered * counted, minlength=size) / 2
                bottleneck = np.bincount(ends, weights=offered * (blamed & counted), minlength=size) > half
                clear = np.bincount(ends, weights=offered * (blamed & ~tie & counted), minlength=size) > half
                for end in np.unique(ends).tolist():
                    self._estimate(table, end).sample(float(total[end]), bool(bottleneck[end]), r, self.alpha,
                                                      ambiguous=not clear[end])
        self._closed = max(self._closed, round)

    def _rates(self, table: dict[int, LinkEstimate], size: int) -> np.ndarray:
        return np.array([table[r].rate if r in table else self.default_rate for r in range(size)])

    def _estimate(self, table: dict[int, LinkEstimate], rank: int) -> LinkEstimate:
        if rank not in table:
            table[rank] = LinkEstimate(self.default_rate, self.default_rate)
        return table[rank]

    def seed(self, estimates: Mapping[str, np.ndarray]) -> None:
        """Take over estimates held elsewhere (a predecessor's view, handed over by a peer):
        ``uplink``, ``downlink`` and their ``_target`` arrays. A line rate this estimator was
        seeded with (the topology) stays; else the target stands in for it."""
        for name, table in (("uplink", self.uplink), ("downlink", self.downlink)):
            for r, (rate, target) in enumerate(zip(estimates[name], estimates[f"{name}_target"])):
                line = max(float(target), float(rate), table[r].line if r in table else 0.0)
                table[r] = LinkEstimate(float(rate), line, target=float(max(target, rate)))

    def seed_link(self, rank: int, rate: float | None) -> None:
        """``rank``'s own interface rate (bytes/s; None: unknown) seeds both its estimates, unless a
        topology or earlier rounds already set them."""
        if rate is not None:
            self.uplink.setdefault(rank, LinkEstimate(rate, rate))
            self.downlink.setdefault(rank, LinkEstimate(rate, rate))

    def arrays(self, size: int) -> dict[str, np.ndarray]:
        """Per rank, for each of ``uplink`` and ``downlink``: the estimate (bytes/s), ``_target``
        (the next probe's rate, bytes/s), ``_age`` (rounds) and ``_noise`` (relative)."""
        out = {}
        for name, table in (("uplink", self.uplink), ("downlink", self.downlink)):
            ends = [table.get(r) or LinkEstimate(self.default_rate, self.default_rate) for r in range(size)]
            out[name] = np.array([e.rate for e in ends])
            age = np.array([self._closed - e.tested for e in ends], dtype=float)
            out[f"{name}_target"] = np.where(age > STALE_ROUNDS, [e.line for e in ends], [e.target for e in ends])
            out[f"{name}_age"] = age
            out[f"{name}_noise"] = np.array([e.noise for e in ends])
        return out
