"""Receiver selection: which peers each sender multicasts to, every round.

`make_policy(name, seed=0, **kw)` builds one by name: selmcast | random | all | ring | exponential.
"""
from __future__ import annotations

from p2plearn.selection.base import SelectionPolicy
from p2plearn.selection.fixed import AllToAll, Exponential, Ring
from p2plearn.selection.random_p import RandomP
from p2plearn.selection.selmcast import Selmcast
from p2plearn.selection.view import PACING_HEADROOM, NetworkView, average_fanout, flow_probes, plan_flows, plan_time

POLICIES: dict[str, type[SelectionPolicy]] = {
    cls.name: cls for cls in (Selmcast, RandomP, AllToAll, Ring, Exponential)
}


def make_policy(name: str, seed: int = 0, **kw) -> SelectionPolicy:
    """The policy called `name`; kw go to its constructor (e.g. selmcast: ip_multicast, max_fanout)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown selection policy {name!r}; choose from {', '.join(POLICIES)}") from None
    return cls(seed=seed, **kw)


__all__ = ["POLICIES", "PACING_HEADROOM", "SelectionPolicy", "NetworkView", "average_fanout", "flow_probes", "plan_flows", "plan_time", "make_policy",
           "Selmcast", "RandomP", "AllToAll", "Ring", "Exponential"]
