"""The control plane in virtual time: the coordinator's own `MembershipTable`, fed what the virtual
peers report, publishing views by the coordinator's rules.

Every virtual peer registers at the start; after each of its rounds it reports what a real peer
reports (its clock, the ACK-timed rate and pace of each flow it sent, its load, its message's bytes),
read by the coordinator's field readers (`control.fields`: malformed or negligible values dropped,
loads below their floor as 0). The table's estimator, its clock table and its publication rule then
decide every view: a new version only when a planning input changed materially (`plans_like`),
applying `VIEW_LEAD` rounds after the fastest reported clock. A round is planned from the view a
client would pick for it (`ViewHistory.for_round`). What the simulator does not model: deaths and
joins (no peer fails in virtual time), and the views' travel time (a view is held as it is published).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from p2plearn.control import MembershipTable
from p2plearn.control import protocol as p
from p2plearn.control.fields import read_links, read_load
from p2plearn.control.view import GlobalView, ViewHistory


class VirtualControl:
    """The table of a virtual job of ``n`` peers, seeded with ``rates`` ({rank: (up, down)} bytes/s)."""

    def __init__(self, n: int, rates: Mapping[int, tuple[float, float]]) -> None:
        self.table = MembershipTable(n, rates=rates)
        self.views = ViewHistory()
        for rank in range(n):
            reply, publications = self.table.register(rank, f"virtual-{rank}", join=False, host="virtual",
                                                      engine=("virtual", rank), standby=None, clock=0, resume=None,
                                                      link_rate=None)
            if reply.get("type") != p.OK:
                raise RuntimeError(f"virtual rank {rank} was refused by the membership table: {reply}")
            self._receive(publications)
        header, blobs = self.table.view().to_blobs()
        self.views.add(GlobalView.from_blobs(header, blobs))  # what registering peers are handed

    def report(self, rank: int, clock: int, links: Mapping[int, Mapping[str, float | str]],
               load: Mapping[str, float], message_bytes: float) -> None:
        """Rank ``rank`` finished the round before ``clock``: its flows (receiver -> paced, rate,
        probe) and load, as a real peer's report carries them."""
        reply, publications = self.table.report(
            rank, f"virtual-{rank}", clock=clock, loss=None, step_time=None, message_bytes=message_bytes,
            links=read_links({str(j): dict(flow) for j, flow in links.items()}), load=read_load(dict(load)))
        if reply is not None:
            raise RuntimeError(f"virtual rank {rank}'s report was refused by the membership table: {reply}")
        self._receive(publications)

    def view_for(self, rnd: int) -> GlobalView:
        view = self.views.for_round(rnd)
        assert view is not None  # one is held from the start
        return view

    def _receive(self, publications) -> None:
        for pub in publications:
            if pub.kind == p.VIEW:
                self.views.add(GlobalView.from_blobs(pub.body["view"], pub.blobs))


def round_load(compute_s: np.ndarray, merge_s: float) -> list[dict[str, float]]:
    """Each virtual peer's load as it reports it: its compute per round and merge time per message
    (nothing backlogged or in flight: the simulator's rounds end whole)."""
    return [{"compute_s": float(c), "merge_s": merge_s} for c in compute_s]
