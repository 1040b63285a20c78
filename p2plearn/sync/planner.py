"""Each peer's part of a round's plan, computed by the peer itself from the view it holds.

A plan is a pure function of (view, selection policy, fanout, seed, round): every peer holding
the same view computes the same plan, so no step asks anyone for it. The view that plans round r
is the newest one whose ``from_round`` is at most r (see ``GlobalView``); peers that hold
different views still interoperate, since a receiver accepts any sender and a BSP round waits for
the senders its own plan expects only up to the round's limit.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from p2plearn.control import GlobalView
from p2plearn.selection import NetworkView, average_fanout, flow_probes, make_policy, plan_flows, plan_time
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
    (``GlobalView.mcast_domain``; -1: none), when there are two or more (a group saves nothing for
    one, and costs a join). The sender's uplink carries one copy for them and one per other receiver."""
    if domain is None:
        return {i: [] for i in plan}
    groups = {}
    for i, rs in plan.items():
        same = [j for j in rs if domain[i] >= 0 and domain[j] == domain[i]]
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
    A sender's group is paced at its slowest member's rate (the engine's rule), each flow at most
    the uplink divided by the sender's copies. The last few whole plans are cached: SSP peers plan
    rounds a little apart from the same view.
    """

    CACHED = 8

    def __init__(self, selection: str, fanout: int, seed: int, transport_mode: str = "unicast", **policy_options) -> None:
        if transport_mode not in TRANSPORT_MODES:
            raise ValueError(f"transport_mode must be one of {', '.join(TRANSPORT_MODES)}, got {transport_mode!r}")
        if selection == "selmcast":
            policy_options["ip_multicast"] = transport_mode == "multicast"
        self.policy = make_policy(selection, seed=seed, **policy_options)
        self.transport_mode = transport_mode
        self.fanout = fanout
        self._cache: dict[tuple, tuple[dict[int, list[tuple[int, float, str]]], dict[int, list[int]], float, float]] = {}

    def plan(self, view: GlobalView, rnd: int, rank: int, own_bytes: float) -> LocalPlan:
        """``own_bytes``: this peer's message size, standing in for sizes the view does not know yet."""
        key = (view.order, rnd)
        if key not in self._cache:
            self._cache[key] = self._whole_plan(view, rnd, own_bytes)
            while len(self._cache) > self.CACHED:
                del self._cache[next(iter(self._cache))]
        flows, groups, planned_time, fanout = self._cache[key]
        senders = sorted(i for i, rs in flows.items() if any(j == rank for j, _, _ in rs))
        mine = flows.get(rank, [])
        return LocalPlan([(j, rate) for j, rate, _ in mine], senders, planned_time, fanout,
                         {j: probe for j, _, probe in mine if probe}, frozenset(groups.get(rank, [])))

    def domains(self, view: GlobalView) -> np.ndarray | None:
        """The multicast domains this planner plans with (None: unicast everywhere)."""
        if self.transport_mode == "unicast":
            return None
        if self.transport_mode == "multicast":
            return np.zeros(view.size, dtype=np.int64)
        return np.asarray(view.mcast_domain)

    def _whole_plan(self, view: GlobalView, rnd: int, own_bytes: float):
        sizes = np.where(view.message_bytes > 0, view.message_bytes, float(own_bytes))
        net = NetworkView.from_global(view, sizes).probed(rnd)  # probes: see selection.view
        domain = self.domains(view)
        plan = self.policy.plan(net, self.fanout, rnd)
        groups = multicast_groups(domain, plan)
        if any(groups.values()):
            # Each of a sender's flows gets at most its uplink / its copies: the group's members,
            # paced at the slowest one's rate, share one copy; every other receiver takes one. (A
            # flow probing a downlink is then capped by that share, not by the whole uplink.)
            copies = np.ones(net.n)
            for i, rs in plan.items():
                copies[i] = max(1, len(rs) - len(groups[i]) + bool(groups[i]))
            src, dst, rates = plan_flows(replace(net, uplink=net.uplink / copies), plan, ip_multicast=True)
        else:
            src, dst, rates = plan_flows(net, plan)
        flows: dict[int, list[tuple[int, float, str]]] = {i: [] for i in plan}
        for i, j, rate, up, down in zip(src, dst, rates, *flow_probes(net, src, dst)):
            flows[int(i)].append((int(j), float(rate), "+".join(e for e, on in (("uplink", up), ("downlink", down)) if on)))
        return flows, groups, plan_time(net, plan, self.transport_mode == "multicast"), average_fanout(plan)
