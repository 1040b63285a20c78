"""SELMCAST: receivers chosen from a global view of every peer's bandwidth and load.

Model. Peer i has available uplink U_i and downlink D_i (wire bytes/s, as the estimator measures
them) and a message of M_i bytes. A plan gives each live sender i a receiver set R_i (i not in
R_i, |R_i| >= p, receivers live). Under application-level multicast (the default: one copy per
receiver) sender i's uplink carries C_i = |R_i| copies of M_i; under IP multicast one copy; in
mixed mode (the view's mcast_domain: peers that reach each other by multicast share a domain)
one copy for the receivers in i's domain and one per receiver outside it. Receiver j's downlink
carries the sum L_j of M_i over the senders that chose j, and its CPU merges those n_j messages.

Load enters T as start times, seconds from the start of the round (the view's load, see
NetworkView.from_global):
- a sender's uplink is free from a_i = compute_s[i] + backlog[i] * merge_s[i]: the peer first
  computes its step, then merges the messages waiting for it, and only then sends;
- a receiver's downlink is free from b_j = max(in_flight_bytes[j] / D_j, min over live i of a_i):
  it first drains what is still arriving to it, and no message of the round leaves before the
  first sender has computed.
- a receiver merges its messages one after another once its CPU is free (a_j), merge_cost[j]
  (the merge_s it reports) each: it has merged them by a_j + n_j merge_cost[j].
T(plan) = max(max_i a_i + C_i M_i / U_i, max_j b_j + L_j / D_j, max_j a_j + n_j merge_cost[j]): a
link carries rate x (T - start) by T, nothing if T <= start. So a slow computer is a straggler: T
is at least its compute plus p of its sends; it gets fewer receivers than peers that start sooner,
and fewer senders (it has less time left to merge them); a receiver still busy with earlier bytes
gets fewer senders. Without load (all starts 0, merging free) this is the bandwidth-only model. What it leaves out: a receiver's downlink is modelled as busy from the first sender's start,
so a message from a straggler, which can only arrive after the straggler's start, is bounded by
the straggler's own uplink term, not by the receiver's. Rounds that probe (NetworkView.probed)
plan with the probed ends at their probe targets.

SELMCAST (Pareto-optimal in two steps, then mixing):
1. minimise T subject to |R_i| >= p for every live sender (bottleneck first), then
2. add receivers beyond p while T does not grow, maximising the sum of |R_i| (a larger average p
   converges faster, and nobody gets slower), then
3. give every live peer that still has no sender one, where that costs nothing in T: a peer that
   never receives never mixes, and its model drifts.

Algorithm (in C, native/planner_steps.c). "Can every sender get p receivers by T?" is a bipartite
degree-constrained assignment without self-loops: sender fan-out floor(U_i (T - a_i) / M_i) (all
live peers under IP multicast, once T > a_i; in mixed mode its copies, the group's counted once),
receiver fan-in D_j (T - b_j) bytes and at most (T - a_j) / merge_cost[j] and max_fanin messages. A sorted
greedy answers it: senders by
decreasing M_i each take the p receivers with the most fan-in left, preferring on ties receivers
that still have to send (they cannot use their own fan-in). With equal message sizes fan-in counts
whole messages, floor(D_j (T - b_j) / M), and the greedy (Kleitman-Wang, adapted to fan-in bounds) is
exact: the tests find the optimal T on every instance. With unequal sizes fan-in is a byte
budget, the question is bin packing (NP-hard), and the greedy is worst-fit decreasing, retried
in other orders (more retries on small views, every other one best fit on views of up to 64
peers). Receivers are ordered by fan-in left in messages of about the current sender's size,
min(bytes left, messages left x M_i), so that a fan-in cap and byte budgets are weighed together.
Near-exact: against an ILP on 1,000 random views of 2-7 peers per class (unequal sizes, p 1-4),
the worst T is 1.041x the optimum with mixed multicast domains, 1.017x with binding fan-in caps,
1.000x with sizes over three decades and a cap, 1.014x with start times or merge costs, and
99.8% of views are within 0.1%; on 600 views of 8-13 peers without caps, 1.031x. Nothing shows
that 5% holds on every view: it is a measured bound, not a proven one. T is found by geometric
bisection to a relative 1e-9 between the best lower bound (max of a_i + p M_i / U_i and
min b + sum(p M) / sum(D)) and a T at which every receiver can take as many of the largest
messages as it may have senders (no byte budget binds there). Step 2 then lets senders by
increasing M_i (smallest first maximises the count) take extra receivers, those with the fewest
senders so far among those whose fan-in left at step 1's T holds the message: spreading the extras
over receivers is what makes them mix (taking those with the most fan-in left gave ~3% more
receivers, all on the fast downlinks, and mixed worse than random p: |lambda_2| 0.55 against
0.08 now on a 1,000-peer view); on the tests this is the most receivers possible at that T in 97%
of instances, and one or two short otherwise. Step 3 moves an edge i -> k whose
receiver k has another sender to a peer j without one, when j's downlink holds M_i by T (edges
tried in a random order per round, so the senders giving one up rotate); no uplink carries more
and T does not grow; with ``mixing_slack`` T may grow by that fraction so that a peer whose downlink
cannot take a whole message by T gets one too (else it receives nothing).
Merge bounds (merge_cost, max_fanin) are counts of messages next to the byte budgets: with equal
sizes the greedy stays exact (tests: ILP). Multicast domains make a sender's budget copies, the
group's counted once; a sender keeps one copy for its group only while its copies cannot reach
the receivers it still wants one by one (a heuristic: the figures above).
Ties break by a random rank drawn from (seed, round). Planning 1,000 peers takes about 10 ms,
10,000 about 150 ms with equal sizes and 350 ms with sizes over one decade (one core of a shared
2-core machine; `python -m p2plearn.bench selection`, which also reports starved peers and the
mixing matrix's |lambda_2| over 20 rounds).

p larger than live - 1 is clamped to live - 1 (everyone sends to everyone); dead peers neither send
nor receive. Rates and sizes must be finite and >= 0, and > 0 for live peers; start times and merge
costs in [0, 1e6] s (more is a corrupt report, not load); multicast domains whole numbers >= -1
that fit an int32 (NetworkView refuses others: a cast would merge domains); else ValueError. With
equal sizes the plan's T is still exact with start times (tests: ILP).

"""
from __future__ import annotations

import numpy as np

from p2plearn.selection.base import SelectionPolicy
from p2plearn.selection.view import NetworkView, multicast_domains
from p2plearn.compute import check, ffi, lib

_U64 = (1 << 64) - 1
DEFAULT_MAX_FANOUT = 64
DEFAULT_MAX_FANIN = 64


class Selmcast(SelectionPolicy):
    """Bandwidth-aware receiver selection (see the module docstring).

    seed: with the round, breaks ties; every peer must use the same seed to compute the same plan.
    ip_multicast: True where the network replicates a message for every peer (one copy on the
        sender's uplink); the sender's fan-out is then limited by receivers' downlinks only.
        Otherwise the view's `mcast_domain` says which peers reach each other by multicast
        (mixed mode: one copy for the group, one per receiver outside it), if it has one.
    max_fanout: cap on receivers per sender beyond p (None = no cap; a round asking for more
        than the cap still gets p). The default, 64, bounds the plan and the work of a round on
        large networks, where one slow peer among fast ones let every other peer send to everyone
        (10,000 peers: 10^8 receivers): capped, 64 x 10,000. It never raises T. Merging costs
        2.7-5.5 ms per 10 MB contribution (2-3.6 GB/s, numpy, one core), so the downlink bounds a
        receiver's fan-in long before the merge does on links below 10 Gbit/s.
    max_fanin: cap on senders per receiver (None = no cap; at least p). A receiver buffers each
        message until it merges it, so fan-in bounds its memory (fan-in x model size) and its merge
        time; the merge time itself also enters T (the view's merge_cost, measured per message).
        The default, 64, like max_fanout: merging in C costs about 3 ms per 10 MB contribution
        (3.2 GB/s on one core), so 64 senders of a 10 MB model add 0.2 s of CPU and 640 MB of
        buffers: beyond that, more senders cost more than they mix.
    mixing_slack: how much T may grow (0.1 = 10%) so that a peer whose downlink cannot take a
        whole message by T still gets a sender (step 3). 0 keeps T; such a peer then mixes only
        in rounds whose T is long enough, or never on a view that does not change.
    """

    name = "selmcast"

    def __init__(self, seed: int = 0, ip_multicast: bool = False, max_fanout: int | None = DEFAULT_MAX_FANOUT,
                 mixing_slack: float = 0.0, max_fanin: int | None = DEFAULT_MAX_FANIN):
        super().__init__(seed)
        for name, cap in (("max_fanout", max_fanout), ("max_fanin", max_fanin)):
            if cap is not None and cap < 1:
                raise ValueError(f"{name} must be >= 1 or None (no cap), got {cap}")
        self.ip_multicast = ip_multicast
        self.max_fanout = max_fanout
        self.max_fanin = max_fanin
        self.mixing_slack = mixing_slack

    def plan(self, view: NetworkView, p: int, round: int) -> dict[int, list[int]]:
        return self.solve(view, p, round)[0]

    def solve(self, view: NetworkView, p: int, round: int) -> tuple[dict[int, list[int]], float]:
        """The plan and its T (seconds)."""
        merge = np.zeros(view.n) if view.merge_cost is None else view.merge_cost
        arrays = [np.ascontiguousarray(a, dtype=np.float64)
                  for a in (view.uplink, view.downlink, view.message_bytes, view.up_start, view.down_start, merge)]
        alive = np.ascontiguousarray(view.alive, dtype=np.uint8)
        domain = multicast_domains(view, self.ip_multicast)
        if any(len(a) != len(alive) for a in arrays) or (domain is not None and len(domain) != len(alive)):
            raise ValueError("uplink, downlink, message_bytes, up_start, down_start, merge_cost, mcast_domain and "
                             "alive must have one entry per peer")
        # the buffers are locals: they outlive the call that reads them through the struct
        up, down, size, up_start, down_start, merge_cost = (ffi.from_buffer("double[]", a) for a in arrays)
        alive_buf = ffi.from_buffer("uint8_t[]", alive)
        domain_buf = ffi.NULL if domain is None else ffi.from_buffer("int32_t[]", np.ascontiguousarray(domain))
        c_view = ffi.new("p2p_view *", {"n": len(alive), "uplink": up, "downlink": down, "message_bytes": size,
                                        "up_start": up_start, "down_start": down_start, "merge_cost": merge_cost,
                                        "mcast_domain": domain_buf, "alive": alive_buf})
        out = ffi.new("p2p_plan *")
        check(lib.p2p_plan_make(c_view, p, self._cap(self.max_fanout, p), self._cap(self.max_fanin, p),
                                self.mixing_slack, self.seed & _U64, round & _U64, out))
        try:
            offsets = np.frombuffer(ffi.buffer(out.offsets, 8 * (out.n + 1)), dtype=np.int64).tolist()
            receivers = np.frombuffer(ffi.buffer(out.receivers, 4 * offsets[-1]), dtype=np.uint32).tolist()
            t = out.time
        finally:
            lib.p2p_plan_free(out)
        return {i: sorted(receivers[offsets[i]:offsets[i + 1]]) for i in np.flatnonzero(alive).tolist()}, t

    @staticmethod
    def _cap(cap: int | None, p: int) -> int:
        """A cap for the C planner: 0 = none; never below p (a round asking for more gets p)."""
        return 0 if cap is None else max(p, cap)
