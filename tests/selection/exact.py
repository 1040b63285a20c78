"""Exact optima for small views, to check SELMCAST against: an ILP (scipy.optimize.milp), and a
plain-Python exhaustive search that checks the ILP on the smallest views."""
from __future__ import annotations

import itertools

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from p2plearn.selection.view import NetworkView, multicast_domains, plan_time

SLACK = 1e-7   # relative: a load equal to T x capacity fits


def _model(view: NetworkView, p: int, ip_multicast: bool):
    """Variables: one per edge (i, j) between live peers, then one per live sender (its multicast
    group carries a copy), then T. Returns the edges, the fan-out rows (receivers per sender), the
    load rows with their starts (a row's seconds of work plus its start is at most T), the rows
    x_ij - g_i <= 0 tying an edge in a sender's domain to its group, and p."""
    live = np.flatnonzero(view.alive).tolist()
    p = min(p, len(live) - 1) if live else 0
    edges = [(i, j) for i in live for j in live if i != j]
    m, up, down = view.message_bytes, view.uplink, view.downlink
    domain = multicast_domains(view, ip_multicast)
    grouped = [domain is not None and domain[i] >= 0 and domain[i] == domain[j] for i, j in edges]
    k, s = len(edges), len(live)
    fan = np.zeros((s, k + s))
    uplink = np.zeros((s, k + s))
    downlink = np.zeros((s, k + s))
    merge = np.zeros((s, k + s))
    ties = np.zeros((sum(grouped), k + s))
    at = {peer: r for r, peer in enumerate(live)}
    for e, ((i, j), in_group) in enumerate(zip(edges, grouped)):
        fan[at[i], e] = 1
        downlink[at[j], e] = m[i] / down[j]
        if view.merge_cost is not None:
            merge[at[j], e] = view.merge_cost[j]
        if in_group:  # carried by i's group copy
            row = sum(grouped[:e])
            ties[row, e], ties[row, k + at[i]] = 1, -1
        else:
            uplink[at[i], e] = m[i] / up[i]
    for i in live:
        uplink[at[i], k + at[i]] = m[i] / up[i]
    starts = [view.up_start[i] for i in live] + [view.down_start[j] for j in live]
    load = np.vstack([uplink, downlink])
    if view.merge_cost is not None:  # a receiver merges from its up_start
        load, starts = np.vstack([load, merge]), starts + [view.up_start[j] for j in live]
    return edges, fan, load, np.array(starts), ties, p


def _constraints(view: NetworkView, p: int, ip_multicast: bool, T: float | None):
    """The ILP's rows (T a variable, or fixed at `T` for step 2), its integrality and bounds."""
    edges, fan, load, starts, ties, p = _model(view, p, ip_multicast)
    n = fan.shape[1]
    if T is None:
        t_col = lambda rows, v: np.hstack([rows, np.full((len(rows), 1), v)])  # noqa: E731
        cons = [LinearConstraint(t_col(fan, 0.0), lb=p), LinearConstraint(t_col(load, -1.0), ub=-starts)]
        if len(ties):
            cons.append(LinearConstraint(t_col(ties, 0.0), ub=0))
        return edges, p, cons, np.ones(n + 1), Bounds(np.zeros(n + 1), np.r_[np.ones(n), np.inf])
    cons = [LinearConstraint(fan, lb=p), LinearConstraint(load, ub=T * (1 + SLACK) - starts)]
    if len(ties):
        cons.append(LinearConstraint(ties, ub=0))
    return edges, p, cons, np.ones(n), Bounds(0, 1)


def optimal_time(view: NetworkView, p: int, ip_multicast: bool = False) -> float:
    """Step 1's optimum: the least T at which every live sender has min(p, live - 1) receivers."""
    edges, p, cons, integral, bounds = _constraints(view, p, ip_multicast, None)
    if p == 0:
        return 0.0
    integral[-1] = 0
    c = np.zeros(len(integral))
    c[-1] = 1.0   # minimise T, the last variable
    res = milp(c, constraints=cons, integrality=integral, bounds=bounds, options={"mip_rel_gap": 1e-9})
    assert res.success, res.message
    return float(res.x[-1])


def max_receivers(view: NetworkView, p: int, T: float, ip_multicast: bool = False) -> int:
    """Step 2's optimum: the most receivers in all with every sender at >= p and no load above T."""
    edges, p, cons, integral, bounds = _constraints(view, p, ip_multicast, T)
    if not edges:
        return 0
    c = np.r_[-np.ones(len(edges)), np.zeros(len(integral) - len(edges))]  # groups cost nothing here
    res = milp(c, constraints=cons, integrality=integral, bounds=bounds, options={"mip_rel_gap": 1e-9})
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
