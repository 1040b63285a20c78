"""Per-peer estimates of available bandwidth and load, seeded from a topology, corrected by measurement.

The estimator (documented here because selection relies on its behaviour):

- Seed: ``uplink[i]`` / ``downlink[i]`` from the topology when one is given, else the line rate of
  the interface peer ``i`` registered from (``p2plearn.transport.nic``: a NIC's negotiated speed,
  10 Gbit/s on loopback), else ``default_rate``.
- Every round each sender reports, per receiver, the rate it delivered (bytes/s), the loss,
  and what it still has in flight; plus ``saturated``: its engine had data queued for the whole
  send, so the network, not the application, set the pace.
- Uplink of sender ``i``: a *saturated* report gives the sample ``sum_j rate[i, j]`` and the
  estimate moves towards it by EWMA (``est += alpha * (sample - est)``), up or down.
- Downlink of receiver ``j``, once per round (all live peers have reported it): the sample is
  ``sum_i rate[i, j]`` over the senders of that round; it counts only when every one of those
  senders was saturated *and* their mean loss towards ``j`` is at least ``loss_threshold``
  (drops at ``j``'s port say that ``j``, not the senders, set the pace).
- An unsaturated sample is ignored: an application-limited rate says what was offered, not
  what the link can carry, so a measured rate moves the estimate only when the link was
  saturated. (Consequence: without saturation the seed stands; that is intended.)
- Load of ``j``: bytes and messages in flight towards ``j``, summed over every sender's latest
  report; a sender that dies or leaves stops counting.

Tuning: ``alpha`` (0..1] trades reaction speed against noise (0.3 follows a changed link in
about 5 rounds); ``loss_threshold`` should sit above the random loss of the network and below
the loss that congestion causes; ``default_rate`` only matters for a peer without a topology
entry whose interface does not report a speed (virtual NICs, Wi-Fi).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np


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


class BandwidthEstimator:
    """Bandwidth and load estimates per rank (see the module docstring for the rules).

    ``rates``: seed from ``seed_rates``; ``default_rate``: bytes/s assumed for a rank with no
    seed (1.25e8 = 1 Gbit/s); ``alpha``: EWMA weight of a new sample; ``loss_threshold``: mean
    loss towards a receiver above which its downlink is taken as the bottleneck.
    """

    def __init__(self, rates: Mapping[int, tuple[float, float]] | None = None, *,
                 default_rate: float = 1.25e8, alpha: float = 0.3, loss_threshold: float = 0.01) -> None:
        self.default_rate = default_rate
        self.alpha = alpha
        self.loss_threshold = loss_threshold
        self.uplink: dict[int, float] = {r: up for r, (up, _) in (rates or {}).items()}
        self.downlink: dict[int, float] = {r: down for r, (_, down) in (rates or {}).items()}
        # sender -> receiver -> (bytes, messages) in flight, from the sender's latest report
        self._in_flight: dict[int, dict[int, tuple[float, float]]] = {}
        # round -> receiver -> [sum of rates, sum of losses, senders, all senders saturated]
        self._incoming: dict[int, dict[int, list]] = defaultdict(dict)

    def _ewma(self, table: dict[int, float], rank: int, sample: float) -> None:
        est = table.get(rank, self.default_rate)
        table[rank] = est + self.alpha * (sample - est)

    def observe(self, sender: int, round: int, links: Mapping[int, Mapping[str, float]], saturated: bool) -> None:
        """One sender's measurements of one round: ``links[receiver]`` has ``rate`` (bytes/s),
        ``loss`` (0..1), ``in_flight_bytes`` and ``in_flight_msgs``."""
        self._in_flight[sender] = {int(j): (float(s.get("in_flight_bytes", 0)), float(s.get("in_flight_msgs", 0)))
                                   for j, s in links.items()}
        if not links:
            return
        if saturated:
            self._ewma(self.uplink, sender, sum(float(s.get("rate", 0.0)) for s in links.values()))
        incoming = self._incoming[round]
        for j, s in links.items():
            acc = incoming.setdefault(int(j), [0.0, 0.0, 0, True])
            acc[0] += float(s.get("rate", 0.0))
            acc[1] += float(s.get("loss", 0.0))
            acc[2] += 1
            acc[3] = acc[3] and saturated

    def close_round(self, round: int) -> None:
        """Every live peer has reported ``round``: apply the downlink samples up to it."""
        for r in [r for r in self._incoming if r <= round]:
            for j, (rate, loss, senders, saturated) in self._incoming.pop(r).items():
                if saturated and loss / senders >= self.loss_threshold:
                    self._ewma(self.downlink, j, rate)

    def seed(self, uplink: np.ndarray, downlink: np.ndarray) -> None:
        """Take over estimates held elsewhere (a predecessor's view, handed over by a peer)."""
        self.uplink.update({r: float(u) for r, u in enumerate(uplink)})
        self.downlink.update({r: float(d) for r, d in enumerate(downlink)})

    def seed_link(self, rank: int, rate: float | None) -> None:
        """``rank``'s own interface rate (bytes/s; None: unknown) seeds both its estimates, unless a
        topology or earlier rounds already set them."""
        if rate is not None:
            self.uplink.setdefault(rank, rate)
            self.downlink.setdefault(rank, rate)

    def forget(self, rank: int) -> None:
        """``rank`` is gone: what it had in flight no longer loads anyone."""
        self._in_flight.pop(rank, None)

    def arrays(self, size: int) -> dict[str, np.ndarray]:
        """``uplink``, ``downlink``, ``load`` (bytes), ``load_msgs`` as arrays of ``size`` ranks."""
        load = np.zeros(size)
        load_msgs = np.zeros(size)
        for flights in self._in_flight.values():
            for j, (nbytes, msgs) in flights.items():
                if j < size:
                    load[j] += nbytes
                    load_msgs[j] += msgs
        return {
            "uplink": np.array([self.uplink.get(r, self.default_rate) for r in range(size)]),
            "downlink": np.array([self.downlink.get(r, self.default_rate) for r in range(size)]),
            "load": load,
            "load_msgs": load_msgs,
        }
