"""A plan as arrays of flows, with the pacing rate the synchronizer gives each receiver."""
from __future__ import annotations

import numpy as np

from p2plearn.selection import NetworkView


def plan_flows(view: NetworkView, plan: dict[int, list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, rate) per flow of `plan`, in plan order (senders as listed, receivers as listed).

    rate = min(D_j / indegree_j, U_i / |R_i|) bytes/s: the receiver's downlink shared by the senders
    that chose it, capped by the sender's uplink share; the coordinator paces each send this way.
    """
    fanout = np.array([len(rs) for rs in plan.values()], dtype=np.int64)
    src = np.repeat(np.fromiter(plan.keys(), dtype=np.int64, count=len(plan)), fanout)
    dst = np.fromiter((j for rs in plan.values() for j in rs), dtype=np.int64, count=int(fanout.sum()))
    indegree = np.bincount(dst, minlength=view.n)
    outdegree = np.bincount(src, minlength=view.n)
    rate = np.minimum(np.asarray(view.downlink, float)[dst] / indegree[dst],
                      np.asarray(view.uplink, float)[src] / outdegree[src])
    return src, dst, rate
