"""The line rate of the network interface an address belongs to: the seed of a peer's bandwidth
estimate when no topology says better (``BandwidthEstimator``), instead of an assumed 1 Gbit/s.

Linux reports an Ethernet NIC's negotiated speed in ``/sys/class/net/IF/speed`` (Mbit/s); virtual
interfaces, Wi-Fi and down links report nothing usable, and their peers keep the default. On
loopback the "link" is memory: ``LOOPBACK_RATE``, so that pacing does not hold back peers of one
host (measured: the engine moves 13-15 Gbit/s per flow on this project's 2-core machine).
"""
from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

LOOPBACK_RATE = 1.25e9  # bytes/s (10 Gbit/s): below one flow's loopback goodput, above any NIC the peers share
SIOCGIFADDR = 0x8915
SYS_CLASS_NET = "/sys/class/net"


def interface_of(address: str) -> str | None:
    """The name of the interface holding IPv4 ``address`` (None: not an address of this host)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def link_rate(address: str, sys_class_net: str = SYS_CLASS_NET) -> float | None:
    """Bytes/s of the interface ``address`` is on; None when the kernel does not know."""
    try:
        if ipaddress.ip_address(address).is_loopback:
            return LOOPBACK_RATE
    except ValueError:
        return None
    name = interface_of(address)
    if name is None:
        return None
    try:
        with open(f"{sys_class_net}/{name}/speed") as f:
            mbit = int(f.read().strip())
    except (OSError, ValueError):  # EINVAL from a virtual or down interface
        return None
    return mbit * 1e6 / 8 if mbit > 0 else None
