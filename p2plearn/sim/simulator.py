"""Flow-level simulation of synchronization rounds (BSP and SSP) over a network of peers."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from p2plearn.selection import NetworkView, average_fanout, make_policy, plan_flows, plan_time
from p2plearn.selection.view import DATAGRAM_DATA, DATAGRAM_WIRE
from p2plearn.sim.fairness import RTOL, max_min_rates
from p2plearn.topology import Topology

# tbf and the engine's pacing both count whole frames (see selection.view.FRAMING), so the data moves at
# 1416 / 1514 (about 0.935) of a link's rate.
WIRE_EFFICIENCY = DATAGRAM_DATA / DATAGRAM_WIRE


@dataclass
class RoundResult:
    """One round, over all peers.

    time_s: from the end of the previous round (the last peer's) to the end of this one, compute
        included; under SSP rounds overlap, so this is the spacing of round ends.
    average_p: receivers per sender in the round's plan.
    delivered: mean fraction of each message's bytes that reached its receiver (1 without loss
        tolerance or deadline).
    planned_s: T(plan) of the selection model (no pacing, no overhead), for comparison.
    """

    round: int
    time_s: float
    average_p: float
    delivered: float
    planned_s: float
    end_s: float


@dataclass
class SimResult:
    """The rounds of one run and their aggregate."""

    rounds: list[RoundResult] = field(default_factory=list)
    # One entry per flow, arrays in the order flows ended: round, src, dst, start_s, end_s, cap
    # (pacing rate), rate (wire bytes/s it moved at on average), delivered (fraction of its message)
    # and slow (1.0 where the slow close ended it, else 0.0).
    flows: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return self.rounds[-1].end_s if self.rounds else 0.0

    def summary(self) -> dict[str, float]:
        """Mean and median round time, mean p, mean delivered fraction, rounds per second."""
        times = np.array([r.time_s for r in self.rounds])
        return {"rounds": len(self.rounds), "mean_round_s": float(times.mean()),
                "median_round_s": float(np.median(times)), "average_p": float(np.mean([r.average_p for r in self.rounds])),
                "delivered": float(np.mean([r.delivered for r in self.rounds])),
                "rounds_per_s": len(self.rounds) / self.total_s if self.total_s > 0 else float("inf")}


class Simulator:
    """Rounds of plan + paced multicast + wait, simulated at the level of flows.

    Every round each peer computes for its step time, then sends its message to the receivers the
    policy chose; each send is one flow per receiver. Flows share each peer's uplink and downlink
    max-min fairly, each capped by its pacing rate (see `plan_flows`); rates are recomputed when
    flows start or end (event-driven; where the caps fit every link, as they do when paced, the rates
    are the caps and stay so until new flows come, which keeps 10,000 peers fast).

    view: per-peer uplink and downlink (bytes/s, the links' rates as shaped, frames included),
        message size (bytes) and liveness; the policy plans on it.
    loss: random loss rate of what each peer receives (scalar or per peer): a flow must send
        f / (1 - loss) of its bytes to deliver a fraction f.
    policy, p, seed, policy_kw: the selection policy (any name make_policy knows), the fanout and
        its seed; plans are drawn per round as the peers would.
    sync: "bsp" (a round ends for all when every flow of it is done) or "ssp" (a peer starts its
        next step as soon as its own sends are done and it is at most `staleness` rounds ahead of
        the slowest peer); ssp with staleness 0 is bsp.
    compute_s: each peer's compute time per step (s; scalar or per peer). compute_spread: per-peer speed spread, the
        step time scaled by exp(N(0, spread)) fixed per peer (0: all equal). jitter: per step, a
        further factor uniform in [1 - jitter, 1 + jitter]. Without spread or jitter SSP gains
        nothing over BSP.
    bound: Early Close loss bound: a flow ends once 1 - bound of its bytes arrived, after the
        whole first pass (the engine closes only then); 0 = exact (retransmit what was lost).
        One for all, one per sender ([n]), or one per sender and layer ([n, L], with
        `layer_shares`): the engine repairs each layer's segment until its own bound holds.
    layer_shares: [L] fractions of a message's bytes in each layer (with a [n, L] bound).
    deadline: seconds after its start at which a flow is cut; it reports what arrived by then.
        One for all or one per sender ([n], inf: none).
    slow_close: S, the engine's `--slow-close` (0: off, else >= 1): a paced flow's planned time is its
        message's wire bytes at its pacing rate; the flow is cut, as at a deadline, once its projected
        end (now + its remaining bytes at its current rate, judged whenever rates change: flows
        starting or ending where links are shared, burst edges) passes start + S x planned time, and
        at start + S x planned time at the latest. Unpaced flows (paced=False) have no plan and no
        slow close. Smaller S bounds a burst's cost tighter and cuts more flows that were only a
        little late (with loss, a flow that must resend more than S - 1 of its bytes is cut).
    paced: cap flows at their pacing rate (the synchronizer's behaviour); False: only fairness.
    efficiency: payload bytes per byte on the link (WIRE_EFFICIENCY for 1500-byte frames).
    latency_s: fixed time a peer's send takes beyond moving its bytes (the close handshake, thread
        wake-ups; grows with a loaded host): `p2plearn.sim.validate` measures it with tiny messages.
    host_rate: bytes/s that all flows together can move (None: unlimited, peers on their own
        machines); set it to model a testbed where one host's CPUs carry every peer's traffic
        (`p2plearn.sim.validate` measures it with all-to-all rounds on 10 Gbit/s links).
    links: links that change while flows move (bursts): links(t) -> (uplink [n], downlink [n], the
        next time they change, inf for never), t in the run's seconds; None: the view's rates
        throughout. The rates move the flows; the plan, the pacing and each flow's loss stay as
        at its start.
    """

    def __init__(self, view: NetworkView, *, loss: float | np.ndarray = 0.0, policy: str = "selmcast",
                 p: int = 2, seed: int = 0, policy_kw: dict | None = None, sync: str = "bsp",
                 staleness: int = 0, compute_s: float = 0.0, compute_spread: float = 0.0, jitter: float = 0.0,
                 bound: float | np.ndarray = 0.0, layer_shares: np.ndarray | None = None,
                 deadline: float | np.ndarray | None = None, slow_close: float = 0.0, paced: bool = True,
                 efficiency: float = WIRE_EFFICIENCY, latency_s: float = 0.0, host_rate: float | None = None,
                 links: Callable[[float], tuple[np.ndarray, np.ndarray, float]] | None = None):
        if sync not in ("bsp", "ssp"):
            raise ValueError(f"sync must be bsp or ssp, got {sync!r}")
        bound = np.asarray(bound, dtype=float)
        if not ((bound >= 0) & (bound < 1)).all():
            raise ValueError(f"bound must be in [0, 1), got {bound}")
        shares = np.ones(1) if layer_shares is None else np.asarray(layer_shares, dtype=float)
        if bound.ndim == 2 and bound.shape != (view.n, len(shares)):
            raise ValueError(f"per-layer bounds must be [{view.n}, {len(shares)}] (peers, layer_shares), got {bound.shape}")
        # [n, L]: every sender's bound of every layer (one layer of share 1 when the bound is uniform)
        self.layer_shares = shares if bound.ndim == 2 else np.ones(1)
        self.layer_bounds = bound if bound.ndim == 2 else np.broadcast_to(bound.reshape(-1, 1), (view.n, 1))
        self.view = view
        self.loss = np.broadcast_to(np.asarray(loss, dtype=float), (view.n,))
        self.policy = make_policy(policy, seed=seed, **(policy_kw or {}))
        self.p = p
        self.staleness = 0 if sync == "bsp" else staleness
        self.deadline = np.broadcast_to(np.asarray(np.inf if deadline is None else deadline, dtype=float), (view.n,))
        if not (slow_close == 0 or slow_close >= 1):
            raise ValueError(f"slow_close must be 0 (off) or at least 1, got {slow_close}")
        self.slow_close = float(slow_close)
        self.paced, self.efficiency = paced, efficiency
        self.latency_s = latency_s
        self.links = links
        self.host_rate = np.inf if host_rate is None else float(host_rate)
        rng = np.random.default_rng(seed)
        compute = np.broadcast_to(np.asarray(compute_s, dtype=float), (view.n,))
        self._speed = compute * np.exp(rng.normal(0.0, compute_spread, view.n)) if compute_spread else compute.copy()
        self._jitter, self._rng = jitter, rng
        self._plans: dict[int, tuple[dict[int, list[int]], tuple]] = {}

    @classmethod
    def from_topology(cls, topology: Topology, message_bytes: float, **kw) -> "Simulator":
        """A simulator of `topology`'s peers (rates, loss), every peer sending `message_bytes`."""
        peers = topology.peers
        up = np.array([topology.uplink_bytes_per_s(x) for x in peers])
        down = np.array([topology.downlink_bytes_per_s(x) for x in peers])
        view = NetworkView(up, down, np.full(len(peers), float(message_bytes)), np.ones(len(peers), dtype=bool))
        kw.setdefault("loss", np.array([topology.loss(x) for x in peers]))
        return cls(view, **kw)

    def plan(self, rnd: int) -> tuple[dict[int, list[int]], tuple]:
        """Round `rnd`'s plan and its flows (src, dst, pacing rate), computed once. A subclass may
        give a fourth array, each flow's bytes (else a flow carries its sender's message)."""
        if rnd not in self._plans:
            plan = self.policy.plan(self.view, self.p, rnd)
            self._plans[rnd] = (plan, plan_flows(self.view, plan))
        return self._plans[rnd]

    def run(self, rounds: int) -> SimResult:
        """Simulate `rounds` rounds from time 0; per-round results in order."""
        return _Run(self, rounds).go()


class PlannedSimulator(Simulator):
    """A Simulator of one round whose plan and flows are given (src, dst, pace[, bytes per flow]),
    not drawn by its own policy: a training round's, planned by its planner."""

    def __init__(self, view: NetworkView, plan: dict[int, list[int]], flows: tuple, **kw):
        super().__init__(view, **kw)
        if self.paced and not (np.asarray(flows[2]) > 0).all():
            raise ValueError("a flow paced at 0 bytes/s never ends")
        self._given = (plan, flows)

    def plan(self, rnd: int) -> tuple[dict[int, list[int]], tuple]:
        return self._given


class _Run:
    """The state of one simulation: active flows as arrays, peers' clocks, pending compute ends."""

    def __init__(self, sim: Simulator, rounds: int):
        self.sim, self.rounds = sim, rounds
        n = sim.view.n
        self.t = 0.0
        self.live = np.asarray(sim.view.alive, dtype=bool)
        self.finished = np.where(self.live, 0, rounds)         # rounds each peer has completed
        self.at_clock = np.bincount(self.finished[self.live], minlength=rounds + 1)
        self.slowest = 0                                         # the live peers' smallest clock
        self.waiting = self.live.copy()                          # done with a round, may not start the next
        self.outstanding = np.zeros(n, dtype=np.int64)           # active flows per sender
        self.arrivals: list[tuple[float, int, int]] = []        # (compute end, peer, round)
        # cut: the deadline; slow_at: when the slow close ends the flow (inf: never; now, once its
        # projection passed start + S x planned time)
        names = ("src", "dst", "cap", "rate", "remaining", "total", "cut", "slow_at", "round", "payload", "survive",
                 "start")
        self.f = {k: np.zeros(0, dtype=np.int64 if k in ("src", "dst", "round") else float) for k in names}
        self.dirty = False                                       # flows or links changed: recompute rates
        self.uplink, self.downlink = sim.view.uplink, sim.view.downlink  # the links' rates now
        self.next_change = np.inf                                # when they change next
        if sim.links is not None:
            self.uplink, self.downlink, self.next_change = sim.links(0.0)
        self.feasible = True                                     # the caps fit every link
        self.end = np.zeros(rounds)
        self.delivered_sum = np.zeros(rounds)
        self.flows_per_round = np.zeros(rounds)
        self.ended: list[dict[str, np.ndarray]] = []            # the retired flows, for SimResult.flows

    def go(self) -> SimResult:
        self._release(0.0)
        while self.slowest < self.rounds:
            self._step()
        results = []
        for r in range(self.rounds):
            plan, _ = self.sim.plan(r)
            prev = self.end[r - 1] if r else 0.0
            delivered = self.delivered_sum[r] / self.flows_per_round[r] if self.flows_per_round[r] else 1.0
            results.append(RoundResult(r, float(self.end[r] - prev), average_fanout(plan), float(delivered),
                                       plan_time(self.sim.view, plan), float(self.end[r])))
        keys = ("round", "src", "dst", "start_s", "end_s", "cap", "rate", "delivered", "slow")
        flows = {k: np.concatenate([e[k] for e in self.ended]) if self.ended else np.zeros(0) for k in keys}
        return SimResult(results, flows)

    # --- peers ------------------------------------------------------------------------------

    def _release(self, t: float) -> None:
        """Start the next step of every waiting peer within the staleness bound of the slowest."""
        go = np.flatnonzero(self.waiting & (self.finished <= self.slowest + self.sim.staleness)
                            & (self.finished < self.rounds))
        self.waiting[go] = False
        steps = self.sim._speed[go]
        if self.sim._jitter:
            steps = steps * self.sim._rng.uniform(1 - self.sim._jitter, 1 + self.sim._jitter, len(go))
        for i, c in zip(go.tolist(), steps.tolist()):
            heapq.heappush(self.arrivals, (t + c, i, int(self.finished[i])))

    def _finish_peers(self, peers: list[int], t: float) -> bool:
        """Peers done with their current round at t; whether that lets any peer start a step."""
        before = self.slowest
        may_start = False
        for i in peers:
            r = int(self.finished[i])
            self.end[r] = max(self.end[r], t)
            self.finished[i] = r + 1
            self.waiting[i] = True
            self.at_clock[r] -= 1
            self.at_clock[r + 1] += 1
            may_start |= r + 1 <= self.slowest + self.sim.staleness
        while self.slowest < self.rounds and self.at_clock[self.slowest] == 0:
            self.slowest += 1
        return may_start or self.slowest > before

    def _start_sends(self, starts: list[tuple[int, int]]) -> None:
        """Peers whose compute ended now send; their flows join the active set."""
        sim, view = self.sim, self.sim.view
        by_round: dict[int, list[int]] = {}
        for i, r in starts:
            by_round.setdefault(r, []).append(i)
        new = {k: [self.f[k]] for k in self.f}
        idle = []
        for r, peers in by_round.items():
            _, flows = sim.plan(r)
            src, dst, cap = flows[:3]
            pick = np.isin(src, peers)
            s, d = src[pick], dst[pick]
            q = sim.loss[d]
            m = flows[3][pick] if len(flows) > 3 else view.message_bytes[s]  # bytes per flow, or per sender
            # The first pass always goes whole; beyond it, each layer's lost bytes are resent until
            # 1 - its bound arrived.
            repairs = np.maximum(1.0, (1.0 - sim.layer_bounds[s]) / (1.0 - q)[:, None])
            payload = m * (repairs @ sim.layer_shares)
            total = payload / sim.efficiency
            new["src"].append(s), new["dst"].append(d)
            new["cap"].append(cap[pick] if sim.paced else np.full(len(d), np.inf))
            new["rate"].append(np.zeros(len(d))), new["remaining"].append(total), new["total"].append(total)
            new["cut"].append(self.t + sim.deadline[s])
            # planned: the first pass's wire bytes at the pacing rate (the engine's plan knows no
            # loss); a pace of 0 or inf is none. RTOL: a flow that keeps its pace at S = 1 ends itself.
            slow_at = np.full(len(d), np.inf)
            if sim.slow_close and sim.paced:
                pace = cap[pick]
                has_plan = (pace > 0) & np.isfinite(pace)
                planned = np.broadcast_to(m, len(d))[has_plan] / sim.efficiency / pace[has_plan]
                slow_at[has_plan] = self.t + sim.slow_close * planned * (1 + RTOL)
            new["slow_at"].append(slow_at)
            new["round"].append(np.full(len(d), r)), new["payload"].append(m), new["survive"].append(1.0 - q)
            new["start"].append(np.full(len(d), self.t))
            count = np.bincount(s, minlength=view.n)
            self.outstanding += count
            self.flows_per_round[r] += len(d)
            idle += [i for i in peers if count[i] == 0]
        self.f = {k: np.concatenate(v) for k, v in new.items()}
        self.dirty = True
        if idle:
            self._finish_peers(idle, self.t)
            self._release(self.t)

    # --- flows ------------------------------------------------------------------------------

    def _rates(self) -> None:
        f = self.f
        n = self.sim.view.n
        up_load = np.bincount(f["src"], weights=f["cap"], minlength=n)
        down_load = np.bincount(f["dst"], weights=f["cap"], minlength=n)
        # Caps that fit every link are the max-min rates themselves (the usual, paced case).
        if ((up_load <= self.uplink * (1 + RTOL)).all() and (down_load <= self.downlink * (1 + RTOL)).all()
                and f["cap"].sum() <= self.sim.host_rate * (1 + RTOL)):
            f["rate"] = f["cap"].copy()
            self.feasible = True
        else:
            f["rate"] = max_min_rates(f["src"], f["dst"], self.uplink, self.downlink, f["cap"], self.sim.host_rate)
            self.feasible = False
        self.dirty = False
        if self.sim.slow_close:
            self._slow_close()

    def _slow_close(self) -> None:
        """End now every flow whose projected end, at the rate it has now, is past its slow close.
        Rates hold until they are next recomputed, so this is the only place a projection moves."""
        f = self.f
        with np.errstate(divide="ignore"):
            projected = self.t + f["remaining"] / f["rate"]
        late = np.isfinite(f["slow_at"]) & (projected > f["slow_at"])
        f["slow_at"][late] = self.t

    def _step(self) -> None:
        f = self.f
        if self.dirty:
            self._rates()
        t_arr = self.arrivals[0][0] if self.arrivals else np.inf
        with np.errstate(divide="ignore"):
            fin = np.minimum(np.minimum(self.t + f["remaining"] / f["rate"], f["cut"]), f["slow_at"])
        t_fin = fin.min(initial=np.inf)
        if t_arr == t_fin == self.next_change == np.inf:
            raise RuntimeError("flows that never end: a live peer has a zero rate and no deadline is set")
        if self.next_change < t_arr and self.next_change <= t_fin:
            self._advance(self.next_change)
            self.uplink, self.downlink, self.next_change = self.sim.links(self.t)
            if not self.next_change > self.t:
                raise RuntimeError(f"links({self.t}) gave its next change at {self.next_change}, not later")
            self.dirty = True
            return
        if t_arr <= t_fin:
            self._advance(t_arr)
            starts = []
            while self.arrivals and self.arrivals[0][0] <= t_arr:
                _, i, r = heapq.heappop(self.arrivals)
                starts.append((i, r))
            self._start_sends(starts)
            return
        # While the caps fit, ends change no rate: take every end up to the next compute end at
        # once, stopping only where a peer's end lets someone start (new flows may change rates).
        horizon = min(t_arr if self.feasible else t_fin * (1 + RTOL), self.next_change)
        ending = np.flatnonzero(fin <= horizon)
        ending = ending[np.argsort(fin[ending], kind="stable")]
        left = self.outstanding.copy()
        np.subtract.at(left, f["src"][ending], 1)
        # A sender finishes at its last flow's end; walk those ends in time order.
        senders = f["src"][ending]
        _, from_back = np.unique(senders[::-1], return_index=True)
        last = np.sort(len(ending) - 1 - from_back)
        last = last[left[senders[last]] == 0]
        stop = len(ending)
        for k in last.tolist():
            at = float(fin[ending[k]]) + self.sim.latency_s
            if self._finish_peers([int(f["src"][ending[k]])], at):
                self._release(at)
                stop = k + 1
                break
        done = ending[:stop]
        self._advance(float(fin[done[-1]]), done, fin[done])

    def _advance(self, t_new: float, done: np.ndarray | None = None, ends: np.ndarray | None = None) -> None:
        """Move every active flow to time t_new; retire the flows in `done` (ended at `ends`)."""
        f = self.f
        if done is not None:
            left = np.maximum(f["remaining"][done] - f["rate"][done] * (ends - self.t), 0.0)
            left[left <= RTOL * f["total"][done]] = 0.0  # float residue of a flow that ended whole
        f["remaining"] = np.maximum(f["remaining"] - f["rate"] * (t_new - self.t), 0.0)
        self.t = t_new
        if done is None:
            return
        sent = (f["total"][done] - left) * self.sim.efficiency
        delivered = np.minimum(1.0, sent * f["survive"][done] / f["payload"][done])
        np.add.at(self.delivered_sum, f["round"][done], delivered)
        start = f["start"][done]
        # ended by the slow close: cut short at its slow_at, before its deadline
        slow = (ends >= f["slow_at"][done]) & (f["slow_at"][done] < f["cut"][done]) & (left > RTOL * f["total"][done])
        with np.errstate(divide="ignore", invalid="ignore"):
            # a flow cut as it starts measured only its rate then
            rate = np.where(ends > start, (f["total"][done] - left) / (ends - start),
                            np.where(slow, f["rate"][done], f["cap"][done]))
        self.ended.append({"round": f["round"][done], "src": f["src"][done], "dst": f["dst"][done], "start_s": start,
                           "end_s": np.asarray(ends, dtype=float), "cap": f["cap"][done], "rate": rate,
                           "delivered": delivered, "slow": slow.astype(float)})
        np.subtract.at(self.outstanding, f["src"][done], 1)
        keep = np.ones(len(f["src"]), dtype=bool)
        keep[done] = False
        for k in f:
            f[k] = f[k][keep]
        if not self.feasible:
            self.dirty = True
