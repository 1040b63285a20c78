"""Measures what each peer's link carries: the figures a global view of bandwidth should see."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from p2plearn.testbed.probe import tcp_transfer, udp_delivery
from p2plearn.testbed.testbed import Testbed

LOSS_DATAGRAM_BYTES = 200
UDP_IP_HEADER_BYTES = 28
# Loss probes use at most this share of the downlink, so that no queue overflows.
LOSS_PROBE_SHARE = 0.5


@dataclass(frozen=True)
class PeerMeasurement:
    """One peer's achieved rates and loss, with the configured values beside them."""

    peer: str
    uplink_mbit: float
    downlink_mbit: float
    loss: float
    configured: dict[str, float]


def measure(testbed: Testbed, seconds: float = 1.0, datagrams: int = 2000) -> list[PeerMeasurement]:
    """Measure every peer's link, one peer at a time, against the switch's own address.

    Traffic between a peer and the switch crosses that peer's link only, so each figure is
    the peer's own: uplink = TCP peer -> switch, downlink = TCP switch -> peer (lower than
    the rate where loss is set: TCP pays for it), loss = share of ``datagrams`` UDP
    datagrams from the switch that the peer did not receive.

    seconds: length of each TCP transfer (two per peer); longer is steadier.
    datagrams: UDP datagrams per loss probe; the error of the loss figure is about
        sqrt(loss / datagrams), e.g. 0.5 points at 5% loss with 2000.
    """
    results = []
    for peer in testbed.peers:
        on_peer = functools.partial(testbed.run, peer)
        configured = testbed.link(peer)
        uplink = tcp_transfer(on_peer, testbed.run_on_switch, testbed.switch_address, seconds)
        downlink = tcp_transfer(testbed.run_on_switch, on_peer, testbed.address(peer), seconds)
        probe_pps = min(
            datagrams / seconds,
            LOSS_PROBE_SHARE * configured["downlink_mbit"] * 1e6 / 8 / (LOSS_DATAGRAM_BYTES + UDP_IP_HEADER_BYTES),
        )
        (delivered,) = udp_delivery(
            testbed.run_on_switch, [on_peer], testbed.address(peer), datagrams, probe_pps,
            LOSS_DATAGRAM_BYTES,
        )
        results.append(PeerMeasurement(peer, uplink["mbit"], downlink["mbit"], 1 - delivered, configured))
    return results


def format_table(measurements: list[PeerMeasurement]) -> str:
    """Measurements as an aligned text table: each measured figure, then the configured one."""
    header = ("peer", "up_mbit", "(set)", "down_mbit", "(set)", "loss_%", "(set)")
    lines = [f"{header[0]:<10}" + "".join(f"{title:>11}" for title in header[1:])]
    for m in measurements:
        c = m.configured
        figures = (m.uplink_mbit, c["uplink_mbit"], m.downlink_mbit, c["downlink_mbit"],
                   m.loss * 100, c["loss"] * 100)
        lines.append(f"{m.peer:<10}" + "".join(f"{figure:>11.2f}" for figure in figures))
    return "\n".join(lines)
