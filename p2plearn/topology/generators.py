"""Generators of the standard topologies (the files in ``topology/`` come from ``STANDARD``).

Peers are named ``p0`` .. ``p{n-1}``. Every generator is deterministic given its arguments.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from p2plearn.topology.topology import Topology


def _topology(name: str, description: str, nodes: list[dict[str, Any]]) -> Topology:
    data = {"graph": {"name": name, "description": description}, "nodes": nodes, "edges": []}
    return Topology.from_data(data, source=f"<{name}>")


def homogeneous(n: int, mbit: float = 100.0, loss: float = 0.0) -> Topology:
    """``n`` peers with ``mbit`` up and down and random ``loss`` on what each receives."""
    nodes = [
        {"id": f"p{i}", "uplink_mbit": mbit, "downlink_mbit": mbit, "loss": loss}
        for i in range(n)
    ]
    return _topology(f"homogeneous-{n}", f"{n} peers at {mbit:g} Mbit/s up and down", nodes)


def heterogeneous(
    n: int,
    tiers: Sequence[float] = (50.0, 100.0, 200.0, 500.0),
    seed: int = 0,
    up_ratios: Sequence[float] = (1.0, 0.5, 0.25),
    bursty: int = 0,
    every_s: float = 10.0,
    duration_s: float = 2.0,
    burst_rate_factor: float = 0.1,
) -> Topology:
    """``n`` peers whose downlinks cycle through ``tiers`` (Mbit/s) in a shuffled order.

    seed: picks the shuffle and each peer's ratio; change it for another mix of the same tiers.
    up_ratios: uplink = downlink x a ratio drawn from these (1.0 symmetric, lower values
        model asymmetric access links such as DSL or cable).
    bursty: how many peers (drawn with ``seed``) have recurring congestion bursts on their
        downlink: every ``every_s`` seconds it drops to ``burst_rate_factor`` x its rate for
        ``duration_s`` seconds, the peers' first bursts staggered within the period. A burst the
        view should follow must outlast about 3 of the job's rounds (the view falls within 3);
        shorter ones act like ``microburst``'s, disturbing the rounds they hit.
    """
    rng = random.Random(seed)
    downlinks = [tiers[i % len(tiers)] for i in range(n)]
    rng.shuffle(downlinks)
    nodes = [
        {"id": f"p{i}", "uplink_mbit": down * rng.choice(up_ratios), "downlink_mbit": down}
        for i, down in enumerate(downlinks)
    ]
    description = f"{n} peers, downlinks from tiers {list(tiers)} Mbit/s, seed {seed}"
    for i in sorted(rng.sample(range(n), bursty)):
        nodes[i]["events"] = [{
            "at_s": round(rng.uniform(0, every_s - duration_s), 3),
            "duration_s": duration_s,
            "every_s": every_s,
            "downlink_mbit": nodes[i]["downlink_mbit"] * burst_rate_factor,
        }]
    if bursty:
        description += (f"; {bursty} of them drop to {burst_rate_factor:g}x downlink for {duration_s:g} s "
                        f"every {every_s:g} s")
    return _topology(f"heterogeneous-{n}", description, nodes)


def incast(n: int, mbit: float = 1000.0, buffer_kb: float = 48.0) -> Topology:
    """``n`` peers at ``mbit`` whose switch ports queue only ``buffer_kb`` KiB.

    Many senders into one port then overflow its queue and tail-drop, as in a datacenter
    incast; 32-64 KiB matches shallow-buffered switches, smaller values drop sooner.
    """
    nodes = [
        {"id": f"p{i}", "uplink_mbit": mbit, "downlink_mbit": mbit, "buffer_kb": buffer_kb}
        for i in range(n)
    ]
    description = f"{n} peers at {mbit:g} Mbit/s with {buffer_kb:g} KiB switch buffers"
    return _topology(f"incast-{n}", description, nodes)


def microburst(
    n: int,
    mbit: float = 100.0,
    every_s: float = 5.0,
    duration_s: float = 0.25,
    burst_loss: float = 0.2,
    burst_rate_factor: float = 0.1,
    seed: int = 0,
) -> Topology:
    """``n`` peers at ``mbit`` hit by periodic bursts of loss and downlink collapse.

    every_s: period of each peer's bursts; duration_s: how long each lasts.
    burst_loss: loss rate during a burst; burst_rate_factor: downlink during a burst as a
        fraction of ``mbit``.
    seed: staggers the peers' first bursts within the period, so they do not all coincide.
    """
    rng = random.Random(seed)
    nodes = []
    for i in range(n):
        event = {
            "at_s": round(rng.uniform(0, every_s - duration_s), 3),
            "duration_s": duration_s,
            "every_s": every_s,
            "downlink_mbit": mbit * burst_rate_factor,
            "loss": burst_loss,
        }
        nodes.append(
            {"id": f"p{i}", "uplink_mbit": mbit, "downlink_mbit": mbit, "events": [event]}
        )
    description = (
        f"{n} peers at {mbit:g} Mbit/s; every {every_s:g} s each has a {duration_s:g} s burst "
        f"of {burst_loss:g} loss and {burst_rate_factor:g}x downlink"
    )
    return _topology(f"microburst-{n}", description, nodes)


# The files shipped in topology/: file stem -> generator call.
STANDARD: dict[str, Callable[[], Topology]] = {
    "homogeneous-4": lambda: homogeneous(4),
    "homogeneous-8": lambda: homogeneous(8),
    "heterogeneous-4": lambda: heterogeneous(4),
    "heterogeneous-8": lambda: heterogeneous(8),
    "heterogeneous-16": lambda: heterogeneous(16, tiers=(25.0, 50.0, 100.0), up_ratios=(1.0, 0.5), bursty=4),
    # The same links without the bursts: what the bursts cost, measured beside them.
    "heterogeneous-16-steady": lambda: heterogeneous(16, tiers=(25.0, 50.0, 100.0), up_ratios=(1.0, 0.5)),
    "incast-8": lambda: incast(8),
    "microburst-8": lambda: microburst(8),
}
