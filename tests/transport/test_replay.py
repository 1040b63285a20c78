"""Replay refusal: every datagram carries its sender's session and counter under the tag, and a
receiver takes each (sender, session, counter) once (native/replay.c); the tag also covers the
datagram's destination, so that a datagram is good at the one receiver it was sent to."""
from __future__ import annotations

import random
import socket
import time

import numpy as np
import pytest

from p2plearn.transport import Reason
from tests.transport.craft import ACK, DATA, HDR, datagram, settled

KEY, JOB = bytes(range(32)), 41


def captured_message(sender, x: np.ndarray) -> tuple[list[bytes], tuple[str, int]]:
    """Message 5 as `sender` sends it to a wiretap socket, and the wiretap's address (free again, for
    the receiver the capture was meant for, once the sender gave up)."""
    wiretap = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        wiretap.bind(("127.0.0.1", 0))
        handle = sender.send(5, [x], [wiretap.getsockname()], deadline=0.5)
        captured = capture(wiretap, time.monotonic() + 0.3)
        handle.wait(10)
        captured += capture(wiretap, time.monotonic() + 0.1)
        address = wiretap.getsockname()
    finally:
        wiretap.close()
    data = [HDR.unpack(d[:HDR.size]) for d in captured if HDR.unpack(d[:HDR.size])[2] == DATA]
    assert {h[6] for h in data} == set(range(data[0][7])), "the first pass was not captured whole"
    return captured, address


def capture(sock: socket.socket, until: float) -> list[bytes]:
    """Every datagram a sender sends to `sock` until the deadline (it gets no ACK, so it repeats)."""
    got = []
    sock.settimeout(0.05)
    while time.monotonic() < until:
        try:
            got.append(sock.recv(65536))
        except socket.timeout:
            pass
    return got


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.mark.parametrize("key", [KEY, None], ids=["tags-on", "tags-off"])
def test_captured_datagrams_replayed_from_another_port_deliver_nothing(channels, raw_peer, key):
    a = channels(sender_id=3, key=key, job_id=JOB)
    x = np.random.default_rng(0).random(20_000).astype(np.float32)
    captured, meant_for = captured_message(a, x)
    b = channels(host=meant_for[0], port=meant_for[1], key=key, job_id=JOB)  # the receiver it was sent to

    for d in captured:  # the attacker forwards what it saw: the message arrives once, intact
        raw_peer.send(d, b.address)
    got = b.recv(timeout=5)
    assert got is not None and (got.sender, got.msg_id, got.reason) == (3, 5, Reason.COMPLETE)
    np.testing.assert_array_equal(got.arrays[0], x)
    before = settled(b)

    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # then replays it all from another port
    try:
        for d in captured:
            other.sendto(d, b.address)
        wait_for(lambda: b.stats()["drop_replayed"] - before["drop_replayed"] >= len(captured))
    finally:
        other.close()
    after = settled(b)
    assert after["drop_replayed"] - before["drop_replayed"] == len(captured)
    assert after["datagrams_received"] - before["datagrams_received"] == len(captured)
    assert after["datagrams_sent"] == before["datagrams_sent"], "a replay drew an answer"
    assert b.recv(timeout=0.3) is None, "a replayed message was delivered again"


def test_reordering_within_the_window_is_accepted_and_older_is_refused(channels, raw_peer):
    b = channels(key=KEY, job_id=JOB)

    def ack(counter: int, session: int = 7) -> None:  # an ACK for no message: counted drop_unknown if taken
        raw_peer.send(datagram(ACK, body=bytes(24), job=JOB, key=KEY, to=b.address, session=session, counter=counter),
                      b.address)

    def outcome(counter: int, session: int = 7) -> str:
        before = b.stats()
        ack(counter, session)
        deadline = time.monotonic() + 5
        while True:
            now = b.stats()
            if now["drop_unknown"] > before["drop_unknown"]:
                return "taken"
            if now["drop_replayed"] > before["drop_replayed"]:
                return "refused"
            assert time.monotonic() < deadline, "the datagram did not arrive"

    assert outcome(5000) == "taken"
    shuffled = list(range(5000 - 2047, 5000))
    random.Random(0).shuffle(shuffled)
    assert {outcome(c) for c in shuffled[:200]} == {"taken"}  # late, but within the last 2048
    assert outcome(shuffled[0]) == "refused"  # the same again
    assert outcome(5000 - 2049) == "refused"  # older than the window
    assert outcome(0, session=8) == "taken"  # another session (or sender) has a window of its own
    assert outcome(1 << 31) == "taken"  # far ahead moves the window
    assert outcome(5001) == "refused"


def test_a_forged_tag_does_not_move_the_window(channels, raw_peer):
    """Only authentic datagrams reach the window: an outsider cannot push a sender's window ahead."""
    b = channels(key=KEY, job_id=JOB)
    forged = datagram(ACK, body=bytes(24), job=JOB, key=bytes(32), to=b.address, session=7, counter=1 << 31)
    raw_peer.send(forged, b.address)
    raw_peer.send(datagram(ACK, body=bytes(24), job=JOB, key=KEY, to=b.address, session=7, counter=1), b.address)
    wait_for(lambda: sum(b.stats()[k] for k in ("drop_bad_tag", "drop_unknown", "drop_replayed")) >= 2)
    st = b.stats()
    assert (st["drop_bad_tag"], st["drop_unknown"], st["drop_replayed"]) == (1, 1, 0)


def test_a_message_replayed_to_another_receiver_is_refused_by_tag(channels):
    """An eavesdropper without the key captures a message meant for one peer and replays it to
    another (whose replay window never saw it): the tag covers the destination, so nothing of it
    is delivered or answered there, and each datagram is counted."""
    a = channels(sender_id=3, key=KEY, job_id=JOB)
    x = np.random.default_rng(1).random(20_000).astype(np.float32)
    captured, meant_for = captured_message(a, x)
    other = channels(key=KEY, job_id=JOB)  # another member, on the same host
    elsewhere = channels(host="127.0.0.2", port=meant_for[1], key=KEY, job_id=JOB)  # same port, another address
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for victim in (other, elsewhere):
            for d in captured:
                attacker.sendto(d, victim.address)
            wait_for(lambda: victim.stats()["drop_bad_tag"] >= len(captured))
    finally:
        attacker.close()
    for victim in (other, elsewhere):
        st = settled(victim)
        assert st["drop_bad_tag"] == st["datagrams_received"] == len(captured), st
        assert st["datagrams_sent"] == 0, "a redirected replay drew an answer"
        assert victim.recv(timeout=0.2) is None, "a redirected replay was delivered"
