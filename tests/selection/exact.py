"""Exact optima for small views, to check SELMCAST against: an ILP (scipy.optimize.milp), and a
plain-Python exhaustive search that checks the ILP on the smallest views."""
from __future__ import annotations

import itertools

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from p2plearn.selection.view import NetworkView, plan_time

SLACK = 1e-7   # relative: a load equal to T x capacity fits


def _model(view: NetworkView, p: int, ip_multicast: bool):
    """Edges (i, j) between live peers, for each sender and receiver its row of relative loads and
    its start time (a load row plus its start is at most T)."""
    live = np.flatnonzero(view.alive).tolist()
    p = min(p, len(live) - 1) if live else 0
    edges = [(i, j) for i in live for j in live if i != j]
    m, up, down = view.message_bytes, view.uplink, view.downlink
    fan = np.array([[1.0 if e[0] == i else 0.0 for e in edges] for i in live]).reshape(len(live), len(edges))
    load = [fan[k] * (m[i] / up[i]) for k, i in enumerate(live)] if not ip_multicast else []
    load += [np.array([m[e[0]] / down[j] if e[1] == j else 0.0 for e in edges]) for j in live]
    starts = ([] if ip_multicast else [view.up_start[i] for i in live]) + [view.down_start[j] for j in live]
    floor = max((view.up_start[i] + m[i] / up[i] for i in live), default=0.0) if ip_multicast and p > 0 else 0.0
    return edges, fan, np.array(load, dtype=float).reshape(len(load), len(edges)), p, floor, np.array(starts)


def optimal_time(view: NetworkView, p: int, ip_multicast: bool = False) -> float:
    """Step 1's optimum: the least T at which every live sender has min(p, live - 1) receivers."""
    edges, fan, load, p, floor, starts = _model(view, p, ip_multicast)
    if p == 0:
        return 0.0
    k = len(edges)
    c = np.zeros(k + 1)
    c[-1] = 1.0   # minimise T, the last variable
    cons = [LinearConstraint(np.hstack([fan, np.zeros((len(fan), 1))]), lb=p),
            LinearConstraint(np.hstack([load, -np.ones((len(load), 1))]), ub=-starts)]
    res = milp(c, constraints=cons, integrality=np.r_[np.ones(k), 0],
               bounds=Bounds(np.r_[np.zeros(k), floor], np.r_[np.ones(k), np.inf]),
               options={"mip_rel_gap": 1e-9})
    assert res.success, res.message
    return float(res.x[-1])


def max_receivers(view: NetworkView, p: int, T: float, ip_multicast: bool = False) -> int:
    """Step 2's optimum: the most receivers in all with every sender at >= p and no load above T."""
    edges, fan, load, p, floor, starts = _model(view, p, ip_multicast)
    if not edges:
        return 0
    cons = [LinearConstraint(fan, lb=p), LinearConstraint(load, ub=T * (1 + SLACK) - starts)]
    res = milp(-np.ones(len(edges)), constraints=cons, integrality=np.ones(len(edges)),
               bounds=Bounds(0, 1), options={"mip_rel_gap": 1e-9})
    assert res.success, res.message
    return int(round(-res.fun))


def brute_force(view: NetworkView, p: int, ip_multicast: bool = False) -> tuple[float, int]:
    """(optimal T, most receivers at that T) by trying every plan; for n <= 4 only."""
    live = np.flatnonzero(view.alive).tolist()
    p = min(p, len(live) - 1) if live else 0
    choices = [[list(s) for k in range(p, len(live))
                for s in itertools.combinations([j for j in live if j != i], k)] for i in live]
    scored = [(plan_time(view, dict(zip(live, rs)), ip_multicast), sum(map(len, rs)))
              for rs in itertools.product(*choices)]
    best = min(t for t, _ in scored)
    return best, max(total for t, total in scored if t <= best * (1 + SLACK))
