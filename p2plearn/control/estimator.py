"""Per-peer estimates of available bandwidth, seeded from a topology, corrected by what receivers saw.

Units: every rate here is in wire bytes/s, frames as a link counts them (the topology's rates, the
pacing rates and the engine's ACK-based rates alike).

The estimator (documented here because selection relies on its behaviour):

- Seed: ``uplink[i]`` / ``downlink[i]`` from the topology when one is given, else the line rate of
  the interface peer ``i`` registered from (``p2plearn.transport.nic``: a NIC's negotiated speed,
  10 Gbit/s on loopback), else ``default_rate``. The seed is also the end's *ceiling*: the rate
  that probing looks for again after a drop (see ``selection.view.probe_gains``).
- Every round each sender reports, per receiver ``j``: ``paced`` (the rate it paced the flow at,
  0 = unpaced) and ``rate`` (the engine's ACK-based delivery rate: what arrived at ``j`` in the
  first pass, timed by the spread of ``j``'s ACKs; 0 when the transfer was too short to time).
  A flow is *limited* when ``rate < LIMITED * paced``: the network, not our pacing, set its pace.
- Once every live peer has reported a round (``close_round``), every end gets one sample from
  that round's measured flows: the uplink of ``i`` the sum of ``rate[i, j]`` over its flows, the
  downlink of ``j`` the sum of ``rate[i, j]`` over its incoming flows (the flows of a round run
  at about the same time; senders far apart in time overstate a downlink's sum until its
  flows are limited again, which then corrects it). When more than half of the end's flows
  were limited, the end was their shared bottleneck and the sample is its rate: the estimate
  moves towards it by ``alpha``, down or up. Otherwise the end carried at least the sample: the
  estimate rises to it at once and never falls. The majority is what keeps one slow receiver
  from lowering its sender's uplink (one of the sender's flows was limited, not most of them),
  and one slow sender from lowering a receiver's downlink. A flow alone on both its ends blames
  both; the next probe restores the innocent one.
- Pacing runs at 0.95 of the plan's share, so without probes a sample never exceeds the
  estimate; the view's ceilings let the planner probe (pace above the estimate) so that a link
  that recovered is found again.
- Uncertainty per end, in the view: ``age`` (rounds since its last sample; the seed counts as
  round -1) and ``noise`` (an EWMA, weight ``NOISE_ALPHA``, of |sample - estimate| / estimate
  over bottleneck samples).

Tuning: ``alpha`` (0..1] trades reaction speed against noise: at 0.7 a sustained drop is within
3% after 3 rounds (0.3: 34% still after 3); ``LIMITED`` must sit below the ratio of ACK-timed
to paced rate that an uncongested link shows (1.0 where the hosts keep up with the pace) and
above what a congested link delivers; ``default_rate`` only matters for a peer without a topology
entry whose interface does not report a speed (virtual NICs, Wi-Fi).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

LIMITED = 0.8        # a flow that delivered below this fraction of its pace met a bottleneck
NOISE_ALPHA = 0.2    # EWMA weight of a new bottleneck sample's relative deviation


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
    ceiling: float          # the line rate (the seed), or the highest estimate since
    sampled: int = -1       # round of the last sample (-1: the seed)
    noise: float = 0.0      # EWMA of |sample - estimate| / estimate

    def sample(self, value: float, bottleneck: bool, round: int, alpha: float) -> None:
        if bottleneck:
            self.noise += NOISE_ALPHA * (abs(value - self.rate) / self.rate - self.noise)
            self.rate += alpha * (value - self.rate)
        else:
            self.rate = max(self.rate, value)
        self.ceiling = max(self.ceiling, self.rate)
        self.sampled = round


class BandwidthEstimator:
    """Bandwidth estimates per rank (see the module docstring for the rules).

    ``rates``: seed from ``seed_rates``; ``default_rate``: bytes/s assumed for a rank with no
    seed (1.25e8 = 1 Gbit/s); ``alpha``: how far a bottleneck sample moves the estimate.
    """

    def __init__(self, rates: Mapping[int, tuple[float, float]] | None = None, *,
                 default_rate: float = 1.25e8, alpha: float = 0.7) -> None:
        self.default_rate = default_rate
        self.alpha = alpha
        self.uplink: dict[int, LinkEstimate] = {r: LinkEstimate(up, up) for r, (up, _) in (rates or {}).items()}
        self.downlink: dict[int, LinkEstimate] = {r: LinkEstimate(d, d) for r, (_, d) in (rates or {}).items()}
        self._flows: dict[int, list[tuple[int, int, float, float]]] = defaultdict(list)  # round -> flows
        self._closed = 0  # rounds closed so far (ages count from it)

    def observe(self, sender: int, round: int, links: Mapping[int, Mapping[str, float]]) -> None:
        """One sender's flows of one round: ``links[receiver]`` has ``paced`` and ``rate`` (bytes/s)."""
        flows = self._flows[round]
        for j, s in links.items():
            rate, paced = float(s.get("rate", 0.0)), float(s.get("paced", 0.0))
            if 0 < rate < np.inf and 0 <= paced < np.inf:  # rate 0: too short to time
                flows.append((sender, int(j), paced, rate))

    def close_round(self, round: int) -> None:
        """Every live peer has reported ``round``: apply the samples of every round up to it."""
        for r in sorted(r for r in self._flows if r <= round):
            flows = self._flows.pop(r)
            if not flows:
                continue
            src, dst, paced, rate = (np.array(c) for c in zip(*flows))
            limited = rate < LIMITED * np.where(paced > 0, paced, np.inf)
            for table, ends in ((self.uplink, src), (self.downlink, dst)):
                for end in np.unique(ends).tolist():
                    mine = ends == end
                    bottleneck = 2 * np.count_nonzero(limited[mine]) > np.count_nonzero(mine)
                    self._estimate(table, end).sample(float(rate[mine].sum()), bottleneck, r, self.alpha)
        self._closed = max(self._closed, round)

    def _estimate(self, table: dict[int, LinkEstimate], rank: int) -> LinkEstimate:
        if rank not in table:
            table[rank] = LinkEstimate(self.default_rate, self.default_rate)
        return table[rank]

    def seed(self, estimates: Mapping[str, np.ndarray]) -> None:
        """Take over estimates held elsewhere (a predecessor's view, handed over by a peer):
        ``uplink``, ``downlink`` and their ``_ceiling`` arrays."""
        for name, table in (("uplink", self.uplink), ("downlink", self.downlink)):
            for r, (rate, ceiling) in enumerate(zip(estimates[name], estimates[f"{name}_ceiling"])):
                table[r] = LinkEstimate(float(rate), float(max(ceiling, rate)))

    def seed_link(self, rank: int, rate: float | None) -> None:
        """``rank``'s own interface rate (bytes/s; None: unknown) seeds both its estimates, unless a
        topology or earlier rounds already set them."""
        if rate is not None:
            self.uplink.setdefault(rank, LinkEstimate(rate, rate))
            self.downlink.setdefault(rank, LinkEstimate(rate, rate))

    def arrays(self, size: int) -> dict[str, np.ndarray]:
        """Per rank, for each of ``uplink`` and ``downlink``: the estimate (bytes/s), ``_ceiling``
        (bytes/s), ``_age`` (rounds) and ``_noise`` (relative)."""
        out = {}
        for name, table in (("uplink", self.uplink), ("downlink", self.downlink)):
            ends = [table.get(r) or LinkEstimate(self.default_rate, self.default_rate) for r in range(size)]
            out[name] = np.array([e.rate for e in ends])
            out[f"{name}_ceiling"] = np.array([e.ceiling for e in ends])
            out[f"{name}_age"] = np.array([self._closed - e.sampled for e in ends], dtype=float)
            out[f"{name}_noise"] = np.array([e.noise for e in ends])
        return out
