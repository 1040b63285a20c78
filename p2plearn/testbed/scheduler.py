"""Applies a testbed's topology events at their times; ``Testbed.up`` starts it.

Runs as ``python -m p2plearn.testbed.scheduler NAME`` inside the testbed's switch
namespace until every event is over (never, for periodic events without ``until_s``) or
until ``down`` stops it.
"""

from __future__ import annotations

import heapq
import sys
import time
from typing import Iterator

from p2plearn.testbed.testbed import Testbed
from p2plearn.topology import Event, Topology


def timeline(topology: Topology) -> Iterator[tuple[float, str, dict[str, float]]]:
    """(seconds after start, peer, link values to set), in time order, for all events."""
    streams = [
        _changes(peer, event, topology.base_link(peer))
        for peer in topology.peers
        for event in topology.events(peer)
    ]
    return heapq.merge(*streams, key=lambda change: change[0])


def _changes(peer: str, event: Event, base: dict[str, float]) -> Iterator[tuple[float, str, dict[str, float]]]:
    # Events of one peer never overlap (validated), so each ends by restoring the base values.
    restore = {field: base[field] for field in event.changes}
    for start, end in event.occurrences():
        yield start, peer, event.changes
        yield end, peer, restore


def apply(testbed: Testbed, peer: str, values: dict[str, float]) -> None:
    """Set ``peer``'s link to ``values`` (any of uplink_mbit, downlink_mbit, buffer_kb, loss)."""
    testbed.set_rate(
        peer,
        up_mbit=values.get("uplink_mbit"),
        down_mbit=values.get("downlink_mbit"),
        buffer_kb=values.get("buffer_kb"),
    )
    if "loss" in values:
        testbed.set_loss(peer, values["loss"])


def main(argv: list[str] | None = None) -> int:
    """Run the events of testbed ``argv[0]``; returns when the last one has ended."""
    (name,) = sys.argv[1:] if argv is None else argv
    testbed = Testbed.attach(name)
    for at_s, peer, values in timeline(testbed.topology):
        delay = testbed.started_at + at_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        apply(testbed, peer, values)
        print(f"{at_s:10.3f} s  {peer}  {values}  (late by {max(0.0, -delay) * 1e3:.1f} ms)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
