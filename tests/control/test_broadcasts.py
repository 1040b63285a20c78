"""The coordinator's broadcasts (membership, clocks, loss, views) are readable by key holders only."""

import time

import pytest
import zmq

from control_helpers import JOB
from p2plearn.control import protocol as p
from p2plearn.keys import control_key


def _subscriber(address, secret=None):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    if secret is not None:
        p.subscribe_encrypted(sub, secret)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(address)
    return sub


def _received(sub, seconds):
    frames, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if sub.poll(left * 1000):
            frames.append(sub.recv_multipart())
    return frames


@pytest.mark.parametrize("secret", [None, "00" * 32], ids=["plain", "wrong key"])
def test_a_subscriber_without_the_key_receives_nothing(coordinator, connect, key, secret):
    """Anyone can connect to the PUB socket; it once read every tick (clocks, loss, live count) in
    the clear. The coordinator ticks every 0.5 s (faster at a hello): in 2 s a reader gets several."""
    member = connect(0, ("127.0.0.1", 9000))
    member.report(3, loss=0.25)
    outsider, insider = _subscriber(coordinator.pub_address, secret), _subscriber(coordinator.pub_address, key)
    try:
        heard = _received(insider, 2.0)
        assert _received(outsider, 0.1) == []  # heard for as long as the insider
        ticks = [body for body, _ in (p.unpack(control_key(key), JOB, f) for f in heard) if body["type"] == p.TICK]
        assert ticks and ticks[-1]["progress"]["loss"] == 0.25  # the key holder reads them
    finally:
        outsider.close()
        insider.close()
