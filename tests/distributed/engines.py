"""Two ranks' engines in one process, for tests of what runs over them (collectives, point to point)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from p2plearn.distributed.sender import Links
from p2plearn.transport import Channel


@contextmanager
def two_ranks(make: Callable[[Channel, int, dict, Links, dict[int, str]], Any]) -> Iterator[tuple[list, Channel, dict]]:
    """``make(channel, rank, engines, links, departed)`` for ranks 0 and 1 over engines of their
    own, a forger's channel sending as rank 1 (a key holder), and the membership's departures
    (rank -> why) the ranks read; every engine closed at the end."""
    channels = [Channel(sender_id=r) for r in range(2)]
    forger = Channel(sender_id=1)
    departed: dict[int, str] = {}
    try:
        engines = {r: ch.address for r, ch in enumerate(channels)}
        links = Links([1.25e8] * 2, [1.25e8] * 2)
        yield [make(ch, r, engines, links, departed) for r, ch in enumerate(channels)], forger, departed
    finally:
        for ch in (*channels, forger):
            ch.close()
