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
    fan-in rows (senders per receiver), the load rows with their starts (a row's seconds of work
    plus its start is at most T), the rows x_ij - g_i <= 0 tying an edge in a sender's domain to its
    group, and p."""
    live = np.flatnonzero(view.alive).tolist()
    p = min(p, len(live) - 1) if live else 0
    edges = [(i, j) for i in live for j in live if i != j]
    m, up, down = view.message_bytes, view.uplink, view.downlink
    domain = multicast_domains(view, ip_multicast)
    grouped = [domain is not None and domain[i] >= 0 and domain[i] == domain[j] for i, j in edges]
    k, s = len(edges), len(live)
    fan = np.zeros((s, k + s))
    fanin = np.zeros((s, k + s))
    uplink = np.zeros((s, k + s))
    downlink = np.zeros((s, k + s))
    merge = np.zeros((s, k + s))
    ties = np.zeros((sum(grouped), k + s))
    at = {peer: r for r, peer in enumerate(live)}
    for e, ((i, j), in_group) in enumerate(zip(edges, grouped)):
        fan[at[i], e] = 1
        fanin[at[j], e] = 1
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
    return edges, fan, fanin, load, np.array(starts), ties, p


def _constraints(view: NetworkView, p: int, ip_multicast: bool, T: float | None, max_fanin: int | None):
    """The ILP's rows (T a variable, or fixed at `T` for step 2), its integrality and bounds;
    max_fanin: at most that many senders per receiver (None: no cap)."""
    edges, fan, fanin, load, starts, ties, p = _model(view, p, ip_multicast)
    n = fan.shape[1]
    t_col = (lambda rows, v: np.hstack([rows, np.full((len(rows), 1), v)])) if T is None else (lambda rows, v: rows)
    cons = [LinearConstraint(t_col(fan, 0.0), lb=p)]
    if T is None:
        cons.append(LinearConstraint(t_col(load, -1.0), ub=-starts))
    else:
        cons.append(LinearConstraint(load, ub=T * (1 + SLACK) - starts))
    if len(ties):
        cons.append(LinearConstraint(t_col(ties, 0.0), ub=0))
    if max_fanin is not None:
        cons.append(LinearConstraint(t_col(fanin, 0.0), ub=max_fanin))
    if T is None:
        return edges, p, cons, np.ones(n + 1), Bounds(np.zeros(n + 1), np.r_[np.ones(n), np.inf])
    return edges, p, cons, np.ones(n), Bounds(0, 1)


def optimal_time(view: NetworkView, p: int, ip_multicast: bool = False, max_fanin: int | None = None) -> float:
    """Step 1's optimum: the least T at which every live sender has min(p, live - 1) receivers
    (and no receiver more than max_fanin senders)."""
    edges, p, cons, integral, bounds = _constraints(view, p, ip_multicast, None, max_fanin)
    if p == 0:
        return 0.0
    integral[-1] = 0
    c = np.zeros(len(integral))
    c[-1] = 1.0   # minimise T, the last variable
    res = milp(c, constraints=cons, integrality=integral, bounds=bounds, options={"mip_rel_gap": 1e-9})
    assert res.success, res.message
    return float(res.x[-1])


def max_receivers(view: NetworkView, p: int, T: float, ip_multicast: bool = False,
                  max_fanin: int | None = None) -> int:
    """Step 2's optimum: the most receivers in all with every sender at >= p, no load above T and no
    receiver above max_fanin senders."""
    edges, p, cons, integral, bounds = _constraints(view, p, ip_multicast, T, max_fanin)
    if not edges:
        return 0
    c = np.r_[-np.ones(len(edges)), np.zeros(len(integral) - len(edges))]  # groups cost nothing here
    res = milp(c, constraints=cons, integrality=integral, bounds=bounds, options={"mip_rel_gap": 1e-9})
    assert res.success, res.message
    return int(round(-res.fun))


def brute_force(view: NetworkView, p: int, ip_multicast: bool = False,
                max_fanin: int | None = None) -> tuple[float, int]:
    """(optimal T, most receivers at that T) by trying every plan; for n <= 4 only."""
    live = np.flatnonzero(view.alive).tolist()
    p = min(p, len(live) - 1) if live else 0
    choices = [[list(s) for k in range(p, len(live))
                for s in itertools.combinations([j for j in live if j != i], k)] for i in live]
    plans = itertools.product(*choices)
    if max_fanin is not None:
        plans = (rs for rs in plans if np.bincount(sum(rs, []), minlength=view.n).max(initial=0) <= max_fanin)
    scored = [(plan_time(view, dict(zip(live, rs)), ip_multicast), sum(map(len, rs))) for rs in plans]
    best = min(t for t, _ in scored)
    return best, max(total for t, total in scored if t <= best * (1 + SLACK))
