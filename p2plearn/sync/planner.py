"""Each peer's part of a round's plan, computed by the peer itself from the view it holds.

A plan is a pure function of (view, selection policy, fanout, seed, round): every peer holding
the same view computes the same plan, so no step asks anyone for it. The view that plans round r
is the newest one whose ``from_round`` is at most r (see ``GlobalView``); peers that hold
different views still interoperate, since a receiver accepts any sender and a BSP round waits for
the senders its own plan expects only up to the round's limit.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from p2plearn.control import GlobalView
from p2plearn.selection import NetworkView, average_fanout, flow_probes, make_policy, plan_flows, plan_time
from p2plearn.selection.view import FRAMING, multicast_domains
from p2plearn.transport.channel import TRANSPORT_MODES


@dataclass(frozen=True)
class LocalPlan:
    """What round r's plan says to one peer."""

    receivers: list[tuple[int, float]]  # (rank, pacing rate in bytes/s)
    senders: list[int]                  # ranks that send to this peer
    planned_time: float                 # T of the whole plan, seconds
    fanout: float                       # the plan's average p
    probes: dict[int, str]              # receiver -> the end its flow probes ("uplink", "downlink" or both, "+")
    grouped: frozenset[int] = frozenset()  # receivers this peer's multicast group serves (the rest: unicast)


def multicast_groups(domain: np.ndarray | None, plan: dict[int, list[int]]) -> dict[int, list[int]]:
    """Per sender, the receivers its IP multicast group serves: those in its multicast domain
    (``selection.view.multicast_domains``; None: no domains), when there are two or more (for one,
    a unicast copy costs the uplink the same and saves the group's join)."""
    groups = {}
    for i, rs in plan.items():
        same = [] if domain is None or domain[i] < 0 else [j for j in rs if domain[j] == domain[i]]
        groups[i] = same if len(same) > 1 else []
    return groups


class RoundPlanner:
    """Plans rounds with the named selection policy (``selmcast``, ``random``, ...).

    ``seed`` breaks ties and drives the random policies; it must be the same on every peer, as must
    ``policy_options`` (the policy's own, e.g. SELMCAST's ``max_fanout``) and ``transport_mode``:
    how messages reach receivers, for the plan's T, the pacing rates and SELMCAST's choice:
    - ``unicast``: one copy per receiver on the sender's uplink;
    - ``multicast``: every peer in one multicast domain: one copy per sender for all its receivers;
    - ``auto``: the view's multicast domains (``GlobalView.mcast_domain``, from the peers' start-up
      probes): one copy for the receivers in the sender's domain, one per receiver outside it.
    Pacing (``plan_flows``): each flow at most the sender's uplink over its copies, a group at its
    slowest member's rate (the engine's rule). The last few whole plans are cached: SSP peers plan
    rounds a little apart from the same view.
    """

    CACHED = 8

    def __init__(self, selection: str, fanout: int, seed: int, transport_mode: str = "unicast",
                 **policy_options) -> None:
        if transport_mode not in TRANSPORT_MODES:
            raise ValueError(f"transport_mode must be one of {', '.join(TRANSPORT_MODES)}, got {transport_mode!r}")
        self.policy = make_policy(selection, seed=seed, **policy_options)
        self.transport_mode = transport_mode
        self.fanout = fanout
        # (view order, round) -> (whole plan as whole_plan returns it, the network it paced on, who sends to whom)
        self._cache: dict[tuple, tuple[tuple, NetworkView, dict[int, list[int]]]] = {}

    def plan(self, view: GlobalView, rnd: int, rank: int, own_bytes: float) -> LocalPlan:
        """``own_bytes``: this peer's message size this round, standing in for sizes the view does not
        know yet. The view knows each peer's last message only, which a filter that defers whole
        layers makes a hundred bytes one round and a megabyte the next: paced as its last (a share
        of each downlink in proportion to size), such a message would take hours. So a message
        larger than the view's is paced at least at equal shares (as if every message were its
        size: the others may have grown too, as peers running the same filter do), and T is the
        plan's with this size. A smaller one keeps its pace and ends early. Who sends to whom stays
        the view's plan, the same on every peer."""
        key = (view.order, rnd)
        if key not in self._cache:
            self._cache[key] = self._whole_plan(view, rnd, own_bytes)
            while len(self._cache) > self.CACHED:
                del self._cache[next(iter(self._cache))]
        flows, groups, planned_time, fanout = self._grown(*self._cache[key], {rank: own_bytes})
        senders = sorted(i for i, rs in flows.items() if any(j == rank for j, _, _ in rs))
        mine = flows.get(rank, [])
        return LocalPlan([(j, rate) for j, rate, _ in mine], senders, planned_time, fanout,
                         {j: probe for j, _, probe in mine if probe}, frozenset(groups.get(rank, [])))

    def whole_plan(self, view: GlobalView, rnd: int, own_bytes: float, sizes: np.ndarray | None = None):
        """Every sender's plan of round ``rnd`` at once (what ``plan`` caches and each peer reads its
        part of): (flows per sender as (receiver, rate, probe), multicast group per sender, T, average p).
        ``sizes``: every sender's message this round (bytes), where the caller knows them all: each
        sender's flows are paced as its own ``plan`` paces them, and T is the plan's with them all.
        Uncached: the simulator, which plans for all peers, calls it once per round."""
        whole, net, plan = self._whole_plan(view, rnd, own_bytes)
        return whole if sizes is None else self._grown(whole, net, plan, dict(enumerate(sizes)))

    @staticmethod
    def _grown(whole: tuple, net: NetworkView, plan: dict[int, list[int]], sizes: Mapping[int, float]) -> tuple:
        """``whole`` with each sender of ``sizes`` (rank -> this round's bytes) whose message is larger
        than the view's paced at least at equal shares, and T with those sizes (see ``plan``)."""
        flows, groups, planned_time, fanout = whole
        grown = {i: b * FRAMING for i, b in sizes.items() if flows.get(i) and b * FRAMING > net.message_bytes[i]}
        if not grown:
            return whole
        # With equal sizes every downlink is shared equally whatever the size: one pacing serves all.
        src, dst, rates = plan_flows(replace(net, message_bytes=np.ones(net.n)), plan)
        equal = dict(zip(zip(src.tolist(), dst.tolist()), rates.tolist()))
        flows = {i: [(j, max(rate, equal[i, j]), probe) for j, rate, probe in rs] if i in grown else rs
                 for i, rs in flows.items()}
        resized = np.array(net.message_bytes, dtype=float)
        resized[list(grown)] = list(grown.values())
        return flows, groups, plan_time(replace(net, message_bytes=resized), plan), fanout

    def _whole_plan(self, view: GlobalView, rnd: int, own_bytes: float):
        """``whole_plan``, with the network it paced on and the policy's plan (to pace again)."""
        sizes = np.where(view.message_bytes > 0, view.message_bytes, float(own_bytes))
        net = NetworkView.from_global(view, sizes).probed(rnd)  # probes: see selection.view
        # the domains this job sends by, whatever the view says: the policy, pacing and T read them
        domains = {"unicast": None, "multicast": multicast_domains(net, ip_multicast=True),
                   "auto": net.mcast_domain}[self.transport_mode]
        net = replace(net, mcast_domain=domains)
        plan = self.policy.plan(net, self.fanout, rnd)
        flows: dict[int, list[tuple[int, float, str]]] = {i: [] for i in plan}
        src, dst, rates = plan_flows(net, plan)
        for i, j, rate, up, down in zip(src, dst, rates, *flow_probes(net, src, dst)):
            flows[int(i)].append((int(j), float(rate), "+".join(e for e, on in (("uplink", up), ("downlink", down)) if on)))
        groups = multicast_groups(net.mcast_domain, plan)
        return (flows, groups, plan_time(net, plan), average_fanout(plan)), net, plan
