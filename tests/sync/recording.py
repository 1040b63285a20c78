"""What real engines delivered and what real peers merged, recorded per receiver, and handed to the
simulator in their place (`VirtualTraining.arrivals.deliver`, `ReplayedMerges`): the equivalence tests
of training and virtual time compare what each side does with the same chunk masks and, where timing
decides it (SSP), the same choice of messages per merge."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from p2plearn.sim.window import VirtualWindow
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
    """A `VirtualTraining.arrivals.deliver` that hands the receiver what its real engine delivered of
    the same message (its chunk mask and layout, the simulator's arrays), or nothing where it
    delivered nothing."""
    def replay(sender, receiver, msg_id, arrays, exact, delivered):
        d = received.get((receiver, sender, msg_id))
        return None if d is None else replace(d, arrays=arrays)
    return replay


def record_merges(peers) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """From now on, what each BSP or SSP peer's merges take from its inbox: by (receiver, round), the
    (sender, message id) of each delivery, in the order taken, over every take of the round (a merge
    takes what came while it waits, then the rest). The round is the last one the take asks for
    (`MergeWindow.merged(rnd)` ends at rnd)."""
    merged: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def recording(rank, take):
        def take_and_record(first, last):
            out = take(first, last)
            merged.setdefault((rank, last), []).extend((d.sender, d.msg_id) for d in out)
            return out
        return take_and_record

    for peer in peers:
        peer.sync.inbox.take = recording(peer.client.rank, peer.sync.inbox.take)
    return merged


class ReplayedMerges(VirtualWindow):
    """The simulator's merge rule with the choice of messages replaced by what real peers took
    (`record_merges`): the virtual clocks are the rule's, but each receiver's merge after round r
    takes exactly the deliveries its real counterpart took then. One the simulator has no pending
    flow for is an error (the replay could not merge it)."""

    def __init__(self, window: VirtualWindow, merged: dict[tuple[int, int], list[tuple[int, int]]]):
        super().__init__(window.n, window.rule)
        self.merged = merged

    def taken(self, rnd, merge_at, pending):
        keys = list(zip(pending["dst"].astype(int).tolist(), pending["src"].astype(int).tolist(),
                        pending["round"].astype(int).tolist()))
        wanted = {(dst, src, r) for dst in range(self.n) for src, r in self.merged.get((dst, rnd), [])}
        missing = wanted - set(keys)
        assert not missing, f"round {rnd}: real peers merged (receiver, sender, round) {sorted(missing)}, " \
                            "which the simulator has no flow of"
        taken = np.array([key in wanted for key in keys], dtype=bool)
        return taken, taken | (pending["round"] < self.rule.merged(rnd + 1)[0])  # as the rule: too old for later merges
