"""SELMCAST: receivers chosen from a global view of every peer's bandwidth and load.

Model. Peer i has available uplink U_i and downlink D_i (wire bytes/s, as the estimator measures
them) and a message of M_i bytes. A plan gives each live sender i a receiver set R_i (i not in
R_i, |R_i| >= p, receivers live). Under application-level multicast (the default: one copy per
receiver) sender i's uplink carries |R_i| M_i; under IP multicast one M_i. Receiver j's downlink
carries the sum L_j of M_i over the senders that chose j.

Load enters T as start times, seconds from the start of the round (the view's load, see
NetworkView.from_global):
- a sender's uplink is free from a_i = compute_s[i] + backlog[i] * merge_s[i]: the peer first
  computes its step, then merges the messages waiting for it, and only then sends;
- a receiver's downlink is free from b_j = max(in_flight_bytes[j] / D_j, min over live i of a_i):
  it first drains what is still arriving to it, and no message of the round leaves before the
  first sender has computed.
T(plan) = max(max_i a_i + |R_i| M_i / U_i, max_j b_j + L_j / D_j): a link carries rate x (T - start)
by T, nothing if T <= start. So a slow computer is a straggler: T is at least its compute plus p
of its sends, and it gets fewer receivers than peers that start sooner; a receiver still busy
with earlier bytes gets fewer senders. Without load (all starts 0) this is the bandwidth-only
model. What it leaves out: a receiver's downlink is modelled as busy from the first sender's start,
so a message from a straggler, which can only arrive after the straggler's start, is bounded by
the straggler's own uplink term, not by the receiver's. Rounds that probe (NetworkView.probed)
plan with the probed ends at their probe targets.

SELMCAST (Pareto-optimal in two steps, then mixing):
1. minimise T subject to |R_i| >= p for every live sender (bottleneck first), then
2. add receivers beyond p while T does not grow, maximising the sum of |R_i| (a larger average p
   converges faster, and nobody gets slower), then
3. give every live peer that still has no sender one, where that costs nothing in T: a peer that
   never receives never mixes, and its model drifts.

Algorithm (in C, native/planner.c). "Can every sender get p receivers by T?" is a bipartite
degree-constrained assignment without self-loops: sender fan-out floor(U_i (T - a_i) / M_i) (all
live peers under IP multicast, once T > a_i), receiver fan-in D_j (T - b_j) bytes. A sorted
greedy answers it: senders by
decreasing M_i each take the p receivers with the most fan-in left, preferring on ties receivers
that still have to send (they cannot use their own fan-in). With equal message sizes fan-in counts
whole messages, floor(D_j (T - b_j) / M), and the greedy (Kleitman-Wang, adapted to fan-in bounds) is
exact: the tests find the optimal T on every instance. With unequal sizes fan-in is a byte
budget, the question is bin packing (NP-hard), and the greedy is worst-fit decreasing, retried
in other orders (more retries on small views): near-exact, within 5% of the optimal T on every
test instance (an ILP is the reference) and at it on nearly all. T is found by geometric
bisection to a relative 1e-9 between the best lower bound (max of a_i + p M_i / U_i and
min b + sum(p M) / sum(D)) and a T at which every receiver can take everyone. Step 2 then lets senders by
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
Ties break by a random rank drawn from (seed, round). Planning 1,000 peers takes about 7 ms,
10,000 about 80 ms (`python -m p2plearn.bench selection`, which also reports starved
peers and the mixing matrix's |lambda_2| over 20 rounds).

p larger than live - 1 is clamped to live - 1 (everyone sends to everyone); dead peers neither send
nor receive. Rates and sizes must be finite and >= 0, and > 0 for live peers; start times finite and
>= 0 (else ValueError). With equal sizes the plan's T is still exact with start times (tests: ILP).

"""
from __future__ import annotations

import numpy as np

from p2plearn.selection.base import SelectionPolicy
from p2plearn.selection.view import NetworkView
from p2plearn.transport._native import check, ffi, lib

_U64 = (1 << 64) - 1
DEFAULT_MAX_FANOUT = 64


class Selmcast(SelectionPolicy):
    """Bandwidth-aware receiver selection (see the module docstring).

    seed: with the round, breaks ties; every peer must use the same seed to compute the same plan.
    ip_multicast: True where the network replicates a message (one copy on the sender's uplink);
        the sender's fan-out is then limited by receivers' downlinks only.
    max_fanout: cap on receivers per sender beyond p (None = no cap; a round asking for more
        than the cap still gets p). The default, 64, bounds the plan and the work of a round on
        large networks, where one slow peer among fast ones let every other peer send to everyone
        (10,000 peers: 10^8 receivers): capped, 64 x 10,000. It never raises T. Merging costs
        2.7-5.5 ms per 10 MB contribution (2-3.6 GB/s, numpy, one core), so the downlink bounds a
        receiver's fan-in long before the merge does on links below 10 Gbit/s.
    mixing_slack: how much T may grow (0.1 = 10%) so that a peer whose downlink cannot take a
        whole message by T still gets a sender (step 3). 0 keeps T; such a peer then mixes only
        in rounds whose T is long enough, or never on a view that does not change.
    """

    name = "selmcast"

    def __init__(self, seed: int = 0, ip_multicast: bool = False, max_fanout: int | None = DEFAULT_MAX_FANOUT,
                 mixing_slack: float = 0.0):
        super().__init__(seed)
        if max_fanout is not None and max_fanout < 1:
            raise ValueError(f"max_fanout must be >= 1 or None (no cap), got {max_fanout}")
        self.ip_multicast = ip_multicast
        self.max_fanout = max_fanout
        self.mixing_slack = mixing_slack

    def plan(self, view: NetworkView, p: int, round: int) -> dict[int, list[int]]:
        return self.solve(view, p, round)[0]

    def solve(self, view: NetworkView, p: int, round: int) -> tuple[dict[int, list[int]], float]:
        """The plan and its T (seconds)."""
        arrays = [np.ascontiguousarray(a, dtype=np.float64)
                  for a in (view.uplink, view.downlink, view.message_bytes, view.up_start, view.down_start)]
        alive = np.ascontiguousarray(view.alive, dtype=np.uint8)
        if any(len(a) != len(alive) for a in arrays):
            raise ValueError("uplink, downlink, message_bytes, up_start, down_start and alive must have one entry per peer")
        out = ffi.new("p2p_plan *")
        check(lib.p2p_plan_make(len(alive), *(ffi.from_buffer("double[]", a) for a in arrays),
                                ffi.from_buffer("uint8_t[]", alive), p,
                                0 if self.max_fanout is None else max(p, self.max_fanout), self.mixing_slack,
                                int(self.ip_multicast), self.seed & _U64, round & _U64, out))
        try:
            offsets = np.frombuffer(ffi.buffer(out.offsets, 8 * (out.n + 1)), dtype=np.int64).tolist()
            receivers = np.frombuffer(ffi.buffer(out.receivers, 4 * offsets[-1]), dtype=np.uint32).tolist()
            t = out.time
        finally:
            lib.p2p_plan_free(out)
        return {i: sorted(receivers[offsets[i]:offsets[i + 1]]) for i in np.flatnonzero(alive).tolist()}, t
