from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import pytest

from p2plearn.transport import Channel


@pytest.fixture
def channels() -> Iterator[Callable[..., Channel]]:
    """Makes Channels on loopback and closes every one of them, also when the test fails."""
    made: list[Channel] = []

    def make(**kw) -> Channel:
        ch = Channel(**kw)
        made.append(ch)
        return ch

    yield make
    for ch in made:
        with contextlib.suppress(Exception):
            ch.close()


@pytest.fixture
def raw_peer():
    from tests.transport.craft import RawPeer

    peer = RawPeer()
    yield peer
    peer.close()
