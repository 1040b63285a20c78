"""What real engines delivered, recorded per receiver, and handed to the simulator in its place
(`VirtualTraining.deliver`): the equivalence tests of training and virtual time compare what each side
does with the same chunk masks."""
from __future__ import annotations

from dataclasses import replace

from p2plearn.transport.delivery import Delivery


def record_deliveries(peers) -> dict[tuple[int, int, int], Delivery]:
    """From now on, every delivery a peer's channel hands over, by (receiver, sender, message id)."""
    received: dict[tuple[int, int, int], Delivery] = {}

    def recording(rank, recv):
        def recv_and_record(timeout=None):
            d = recv(timeout)
            if d is not None:
                received[(rank, d.sender, d.msg_id)] = d
            return d
        return recv_and_record

    for peer in peers:
        peer.channel.recv = recording(peer.client.rank, peer.channel.recv)
    return received


def replayer(received: dict[tuple[int, int, int], Delivery]):
    """A `VirtualTraining.deliver` that hands the receiver what its real engine delivered of the same
    message (its chunk mask and layout, the simulator's arrays), or nothing where it delivered nothing."""
    def replay(sender, receiver, msg_id, arrays, exact, delivered):
        d = received.get((receiver, sender, msg_id))
        return None if d is None else replace(d, arrays=arrays)
    return replay
