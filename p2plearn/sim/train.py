"""Training in virtual time: N peers' real model replicas in one process, a simulated network.

    python -m p2plearn.sim train -np 256 --topology t.json --sync ssp --staleness 2 --period 16 \\
        --model mlp --hidden 300 --epochs 20 --json out.json

Every peer has its own replica, SGD optimizer (momentum 0.9) and data shard (`train.data.shard`,
i.i.d. or `--dirichlet ALPHA`), and its own virtual clock:
- a local step advances it by the calibrated step time (`sim.calibrate`, measured once per model
  and batch size on this machine) times the peer's speed factor (`compute_spread`: a per-peer
  factor exp(N(0, spread)), seeded: stragglers); an evaluation (`--eval-every`) by the
  calibrated evaluation time, as the real peers spend it;
- every `--period` steps a round: its plan comes from `sync.planner.RoundPlanner` (the selection
  policies of training) on the view a client would pick for it from those the coordinator's own
  `MembershipTable` publishes, fed the peers' reports of the simulated flows' rates, their load and
  message sizes (`sim.control`): new versions by the coordinator's rule, applying a few rounds
  ahead of the fastest peer, so the view lags bursts as it does live;
- the round's flows move on the flow-level simulator (`sim.simulator.Simulator`: pacing, max-min
  sharing, loss with the engine's passes, Early Close at the loss bounds, the deadline), each
  sender starting when its own compute ends; the link rates follow the topology's events (bursts)
  as they begin and end while the flows move, the loss is its receiver's when the round's first
  send starts;
- the loss bounds and deadline: `--tolerance fixed` takes `--loss-bound` and `--deadline-ms`; the
  other policies are every peer's own, fed what a real peer feeds them (`sim.tolerance`), per-layer
  bounds repaired per layer and merged as per-layer chunk masks;
- `--slow-close S`: a flow whose projected end passes S x its planned time is cut as at a deadline
  (`Simulator(slow_close=...)`); each round's log counts them (`slow`) beside its send time
  (`send_s`: the longest sender's, from its compute end to its last flow's) and the plan's T
  (`planned_s`), and the result gives `slow_closed` (all rounds) and `send_over_plan` (the mean
  of send_s / planned_s);
- what arrived is a chunk mask (`sim.arrivals`: the delivered fraction of the message's chunks, the
  missing ones drawn at random as loss leaves them), merged by the C merge (`sync.merge`), then the
  outer update (`sync.outer`, `--outer-lr`, `--outer-momentum`);
- `--compress` and `--filter value` as in training (`sim.messages`): each peer's own compressor or
  value filter (error feedback), the message's encoded bytes on the network (each sender's own size
  in the planner's view and the flow simulator), the receiver merging the decoded values that came;
- BSP and SSP rounds merge by training's rule (`sync.window.MergeWindow`, waited in virtual time by
  `sim.window`): BSP waits for its senders up to training's limit, SSP for the slowest clock;
- `--colocate CORES [--hosts N]`: peers share hosts' cores (`sim.hosts`), their compute and receive
  work serialised over them; by default every peer has a host of its own.
- `--sync partitioned`: training's round (`sync.exchange.PartExchange`, with `--compress` too): its two
  phases (scatter to each part's aggregator, gather of the averaged parts), each on the flow-level
  simulator, with training's layout (`sim.partitioned`).
Rounds of the lock-stepped replicas are taken in order, which is causal. Approximations (said in
every result's `model` field): the flows of one round share the links among themselves, not with an
overlapping round's (SSP); a flow's loss is its receiver's at the round's start; the plan and pacing
do not follow a burst that begins mid-round (the view lags it, as live); the message is one bucket.

Not simulated yet (refused with a message): --overlap, --transport-mode other than unicast,
--fragments, --tolerance layerwise with --compress, --filter value or --sync partitioned. Training's
refusals (--sync partitioned with --filter value) are refused with training's message.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from p2plearn.control.estimator import seed_rates
from p2plearn.options import Options
from p2plearn.selection import NetworkView
from p2plearn.sim.arrivals import Arrivals
from p2plearn.sim.batches import peer_steps
from p2plearn.sim.calibrate import costs, engine_cost, pacing_cost, round_cost
from p2plearn.sim.control import VirtualControl, round_load
from p2plearn.sim.hosts import Hosts
from p2plearn.sim.links import LinkSchedule
from p2plearn.sim.messages import Messages
from p2plearn.sim.partitioned import VirtualPartitioned
from p2plearn.sim.replicas import Replicas
from p2plearn.sim.simulator import PlannedSimulator
from p2plearn.sim.tolerance import VirtualTolerance
from p2plearn.sim.window import VirtualWindow
from p2plearn.sync.merge import merge_parameter
from p2plearn.sync.outer import OuterOptimizer
from p2plearn.sync.partitioned import FILTER_REFUSED
from p2plearn.sync.planner import RoundPlanner
from p2plearn.sync.robust import RobustMerge, combined_stats
from p2plearn.sync.window import MergeWindow
from p2plearn.topology import Topology
from p2plearn.train.data import Dataset
from p2plearn.train.optimizer import describe_layers

UNSUPPORTED = {"overlap": (True,), "transport_mode": ("multicast", "auto")}


@dataclass
class Settings:
    """What a virtual run needs beyond the training options (see `python -m p2plearn.sim train --help`)."""

    batch_size: int = 32
    lr: float = 0.1
    steps: int = 0                      # local steps per peer (0: whole epochs, `epochs`)
    epochs: int = 6
    seed: int = 0
    dirichlet: float | None = None
    eval_every: int = 0                 # local steps between evaluations (0: after each epoch)
    eval_peers: int = 1                 # ranks 0..k-1 evaluated (the history holds rank 0's and their mean)
    message_bytes: float | None = None  # bytes a message occupies on the simulated network (None: the replica's)
    compute_spread: float = 0.0         # per-peer speed factor exp(N(0, spread))
    step_s: float | None = None         # seconds per local step (None: calibrated)
    eval_s: float | None = None         # seconds per evaluation (None: calibrated)
    batched: bool = True                # False: the replicas step one after another (--sequential)
    threads: int = 1                    # torch threads while the run steps (the calibration keeps its own)
    recalibrate: bool = False
    colocate: int = 0                   # cores of each host the peers share (0: hosts of their own; `sim.hosts`)
    hosts: int = 1                      # hosts the peers share when co-located


def _send_over_plan(rounds: list[dict]) -> float:
    """The mean, over rounds that planned a send, of the longest sender's send time / the plan's T
    (nan: none; partitioned rounds log no send time)."""
    ratios = [r["send_s"] / r["planned_s"] for r in rounds if "send_s" in r and r["planned_s"] > 0]
    return float(np.mean(ratios)) if ratios else math.nan


class Progress(NamedTuple):
    """Where a virtual run is, after a local step: steps done of all, rounds done, the slowest
    peer's virtual time, and rank 0's accuracy at the last evaluation (None before the first)."""

    step: int
    steps: int
    rounds: int
    virtual_s: float
    accuracy: float | None


class VirtualTraining:
    """One virtual run; `run()` returns its result (a JSON-able dict)."""

    def __init__(self, options: Options, settings: Settings, topology: Topology, data: Dataset,
                 model_factory, model_name: str):
        for name, refused in UNSUPPORTED.items():
            if getattr(options, name) in refused:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(options, name)}: not simulated yet")
        if options.fragments > 1:
            raise ValueError(f"--fragments {options.fragments}: not simulated yet (virtual rounds carry the whole model)")
        if settings.threads < 1:
            raise ValueError(f"--threads {settings.threads}: at least 1")
        self.options, self.settings, self.data = options, settings, data
        self.links = LinkSchedule(topology)
        self.n = sum(topology.slots(p) for p in topology.peers)
        torch.manual_seed(settings.seed)  # every peer starts from the same model, as in training
        model = model_factory()
        self.replicas = Replicas(model, self.n, lr=settings.lr, path="auto" if settings.batched else "sequential")
        self.replica_bytes = self.replicas.parameters * 4
        self.message_bytes = float(settings.message_bytes or self.replica_bytes)
        measured = costs(model_factory, model_name, settings.batch_size, data.x_test, data.y_test,
                         recalibrate=settings.recalibrate)
        given = {"step_s": settings.step_s, "eval_s": settings.eval_s}
        self.costs = {**measured, **{k: v for k, v in given.items() if v is not None}}
        rng = np.random.default_rng(settings.seed)
        self.speed = np.exp(rng.normal(0.0, settings.compute_spread, self.n)) if settings.compute_spread \
            else np.ones(self.n)
        self.hosts = Hosts(settings.colocate, settings.hosts,
                           *((engine_cost(), round_cost(), pacing_cost()) if settings.colocate else ()))
        # co-located peers share their host's cores; a given step or evaluation time is one measured
        # where the peers ran (a real run's), taken as it is
        stretch = self.hosts.stretch(self.n)
        self.step_s = self.costs["step_s"] * self.speed * (stretch if settings.step_s is None else 1.0)
        self.eval_s = self.costs["eval_s"] * (stretch if settings.eval_s is None else 1.0)
        self.receive_s = stretch * self.hosts.receive_s(self.costs["merge_s"], self.message_bytes, self.replica_bytes)
        self.stretch = stretch
        self.round_s = self.hosts.round_s(self.n)
        # which chunks of a flow's message arrive: drawn, or (a test's `arrivals.deliver`) what real engines delivered
        self.arrivals = Arrivals(settings.seed + 1, self.message_bytes, self.replica_bytes, self.replicas.sizes)
        self.control = VirtualControl(self.n, seed_rates(topology))
        policy = {"max_fanout": options.max_fanout or None, "max_fanin": options.max_fanin or None,
                  "mixing_slack": options.mixing_slack} if options.selection == "selmcast" else {}
        self.planner = RoundPlanner(options.selection, options.fanout, settings.seed, **policy)
        # bsp and ssp rounds merge by training's rule (`sync.window`), waiting in virtual time
        self.window = VirtualWindow(self.n, MergeWindow(options.staleness if options.sync == "ssp" else 0,
                                                        ssp=options.sync == "ssp"))
        self.outer = [OuterOptimizer(options.outer_lr, options.outer_momentum) for _ in range(self.n)]
        # --robust: each receiver's own robust merge (its radius history, its per-sender record)
        self.robust = [RobustMerge(options.robust, options.robust_radius, options.robust_exclude)
                       for _ in range(self.n)] if options.robust != "none" else None
        partitioned = options.sync == "partitioned"
        if partitioned and options.filter == "value":
            raise ValueError(FILTER_REFUSED)
        if partitioned and options.tolerance == "layerwise":
            raise ValueError("--sync partitioned with --tolerance layerwise: not simulated yet (a part carries "
                             "its sender's smallest bound)")
        # compressed or value-filtered messages of bsp/ssp rounds (None: plain float32 values, this class's
        # own path; partitioned rounds encode with training's `PartExchange`)
        self.messages = None if partitioned else \
            Messages.of(options, self.replicas.sizes, self.n, self.message_bytes, self.replica_bytes,
                        self.replicas.numpy(), options.staleness if options.sync == "ssp" else 0)
        if self.messages is not None and options.tolerance == "layerwise":
            raise ValueError("--tolerance layerwise with --compress or --filter value: not simulated yet "
                             "(per-layer chunk masks are the plain message's; add --compress none)")
        # each peer's model as the last round left it: the outer step's anchor, and what compressed
        # partitioned rounds exchange changes from
        keeps_anchor = not all(opt.plain for opt in self.outer) or (partitioned and options.compress != "none")
        self.anchors = self.replicas.numpy().copy() if keeps_anchor else None
        self.partitioned = VirtualPartitioned(self, self.anchors) if partitioned else None
        # The fixed policy needs no state: its bound and deadline are the options' (the scalar path).
        self.tolerance = None if options.tolerance == "fixed" else \
            VirtualTolerance(options, describe_layers(model), self.n)
        self.log = None  # a `p2plearn.monitor.SimLog` (--log-dir, --report): told each round's flows, sends and end

    # --- the run --------------------------------------------------------------------------

    def run(self, progress: Callable[[Progress], None] | None = None) -> dict:
        """The run, on `settings.threads` torch threads (restored after); `progress` is called after
        every local step (`p2plearn-sim train` prints a line from it every few seconds)."""
        previous = torch.get_num_threads()
        torch.set_num_threads(self.settings.threads)
        try:
            return self._run(progress or (lambda _: None))
        finally:
            torch.set_num_threads(previous)

    def _run(self, progress: Callable[[Progress], None]) -> dict:
        s, o = self.settings, self.options
        wall0 = time.monotonic()
        staleness = o.staleness if o.sync == "ssp" else 0
        clock = np.zeros(self.n)                       # when each peer starts its next step
        history: list[tuple[float, float, float]] = []  # (rank 0's virtual s, its accuracy, eval peers' mean)
        rounds: list[dict] = []
        messages: dict[int, np.ndarray] = {}           # round -> every peer's message of it
        # rounds rnd - s..rnd hold messages at once: their arrays are reused, not allocated per round
        message_slots = np.empty((staleness + 1, *self.replicas.flat.shape), dtype=np.float32)
        layers = 1 if self.tolerance is None else len(self.tolerance.layers)
        pending = {k: np.zeros(0) for k in ("round", "src", "dst", "arrival", "delivered")}
        pending["layer_delivered"] = np.zeros((0, layers))
        anchors = self.anchors
        merged = None if self.tolerance is None else self.replicas.numpy().copy()  # each model as last merged
        batches, per_epoch = self._batches()
        total = s.steps or s.epochs * per_epoch
        step = 0
        rnd = 0
        while step < total:
            x, y = next(batches)
            losses = self.replicas.step(x, y)
            step += 1
            clock += self.step_s
            if step % o.period == 0:  # the round is part of the step (DecentralizedOptimizer.step), as in training
                send_at = clock.copy()
                if self.tolerance is not None:
                    self.tolerance.track(self.replicas.numpy() - merged, losses.numpy())
                if o.sync == "partitioned":
                    clock = self._partitioned_round(rnd, clock, anchors, rounds)
                else:
                    messages[rnd] = message_slots[rnd % len(message_slots)]
                    clock, pending = self._round(rnd, clock, staleness, pending, messages, anchors, rounds)
                if merged is not None:
                    np.copyto(merged, self.replicas.numpy())
                if self.log is not None:
                    self.log.round(rnd, send_at, clock, losses.tolist())
                rnd += 1
            if (s.eval_every and step % s.eval_every == 0) or (not s.eval_every and step % per_epoch == 0):
                history.append(self._evaluate(float(clock[0])))
                clock += self.eval_s
            progress(Progress(step, total, rnd, float(clock.max()), history[-1][1] if history else None))
        result = self._result(history, rounds, clock, time.monotonic() - wall0)
        if self.messages is not None:
            result.update(self.messages.summary())
            result["model"] += "; " + Messages.MODEL
        if self.robust is not None:
            result["robust"] = combined_stats(self.robust)
        return result

    def _round(self, rnd: int, clock: np.ndarray, staleness: int, pending: dict[str, np.ndarray],
               messages: dict[int, np.ndarray], anchors: np.ndarray | None,
               rounds: list[dict]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Round `rnd`, every peer sending once its compute is done (at `clock`): its transfers, each
        peer's merge of what it takes, and the clocks after them; the deliveries still pending.
        messages[rnd] is where the round's messages go."""
        clock = clock + self.round_s  # the round's fixed work before the send (co-located peers only)
        np.copyto(messages[rnd], self.replicas.numpy())
        sizes = np.full(self.n, self.message_bytes) if self.messages is None else \
            self.messages.encode(rnd, self.replicas.numpy())
        flows, sends_done, planned_s, deadline = self._transfer(rnd, clock, sizes)
        send_s = float((sends_done - clock).max())  # the longest sender's, from its compute end
        pending = {k: np.concatenate([pending[k], flows[k]]) for k in pending}
        merge_at = self.window.round(rnd, clock, sends_done, flows, deadline, planned_s)  # training's rule
        taken, gone = self.window.taken(rnd, merge_at, pending)
        self._merge(rnd, pending, taken, messages, anchors)
        counts = np.bincount(pending["dst"][taken].astype(int), minlength=self.n)
        pending = {k: v[~gone] for k, v in pending.items()}
        received_s = np.bincount(flows["dst"].astype(int), weights=flows["flow_s"], minlength=self.n)
        pacing_s = self.stretch * self.hosts.pacing_s(sends_done - clock, received_s)
        clock = merge_at + self.receive_s * counts + pacing_s
        if anchors is not None:
            anchors[...] = self.replicas.numpy()
        if self.messages is not None:
            self.messages.merged(self.replicas.numpy())
        rounds.append({"round": rnd, "end_s": float(clock.max()), "average_p": len(flows["src"]) / self.n,
                       "delivered": float(flows["delivered"].mean()) if len(flows["delivered"]) else 1.0,
                       "merged": float(counts.mean()), "slow": int(flows["slow"].sum()),
                       "send_s": send_s, "planned_s": planned_s})
        messages.pop(rnd - staleness, None)
        return clock, pending

    def _batches(self):
        """(x [n, batch, ...], y [n, batch]) per local step, every peer's from its own shard; and the
        steps per epoch (`sim.batches`)."""
        s = self.settings
        return peer_steps(self.data, s.batch_size, self.n, s.seed, s.dirichlet)

    def _evaluate(self, t: float) -> tuple[float, float, float]:
        accs = [self.replicas.accuracy(self.replicas.flat[i], self.data.x_test, self.data.y_test)
                for i in range(min(self.settings.eval_peers, self.n))]
        return (t, accs[0], float(np.mean(accs)))

    def round_bounds(self, rnd: int, sizes: np.ndarray, planned_s: float):
        """Round `rnd`'s loss bounds (the option's, or [n, L]: every peer's policy's per layer), the
        layers' shares of a message (None with one bound for all) and deadlines (None or [n])."""
        o = self.options
        if self.tolerance is None:
            return o.loss_bound, None, o.deadline_ms / 1000 if o.deadline_ms else None
        bounds, deadline = self.tolerance.bounds(rnd, sizes, planned_s)
        return bounds, self.tolerance.shares, deadline

    def _report(self, rnd: int, src: np.ndarray, dst: np.ndarray, paced: np.ndarray, rate: np.ndarray,
                probes: list[str], sizes: np.ndarray) -> None:
        """Every peer's report of round `rnd` to the control plane: of each flow it sent, the
        ACK-timed rate of what arrived (rate) against the pace (a later flow to the same receiver in a
        round replaces it), its load and its message's bytes."""
        if self.log is not None:
            self.log.flows(src, dst, paced, rate, sizes)
        reports: dict[int, dict[int, dict]] = {}
        for i, j, p, r, probe in zip(src.tolist(), dst.tolist(), paced.tolist(), rate.tolist(), probes):
            reports.setdefault(i, {})[j] = {"paced": p, "rate": r, "probe": probe}
        for i, load in enumerate(round_load(self.step_s * self.options.period, self.costs["merge_s"])):
            self.control.report(i, rnd + 1, reports.get(i, {}), load, float(sizes[i]))

    def _partitioned_round(self, rnd: int, clock: np.ndarray, anchors: np.ndarray | None,
                           rounds: list[dict]) -> np.ndarray:
        """Round `rnd` of `--sync partitioned` (`sim.partitioned`), every peer's compute done at
        clock[i]: the clocks after it and the outer step."""
        sizes = np.full(self.n, self.partitioned.message_bytes)
        end, record, f = self.partitioned.round(rnd, clock, sizes, self.control.view_for(rnd))
        self._report(rnd, f["src"], f["dst"], f["cap"], f["rate"] * (1 - f["loss"]), [""] * len(f["src"]), sizes)
        if self.tolerance is not None:
            done = clock.copy()
            np.maximum.at(done, f["src"], f["end_s"])
            self.tolerance.observe(rnd, f["src"], f["delivered"], f["loss"], f["end_s"] - f["start_s"], f["slow"],
                                   done - clock, sizes)
        own = self.replicas.numpy()
        if anchors is not None:
            for i in range(self.n):
                self.outer[i].step([own[i]], [anchors[i]])
            anchors[...] = own
        rounds.append(record)
        return end

    def _transfer(self, rnd: int, send_at: np.ndarray,
                  sizes: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray, float, float | np.ndarray | None]:
        """Round `rnd`'s flows, each peer sending its message of sizes[i] bytes from send_at[i]: per
        flow (round, src, dst, arrival time, delivered fraction, slow-closed or not, seconds it lasted),
        when each peer's sends were done, the plan's T and the deadlines."""
        # The whole plan every peer cuts its own part from (RoundPlanner.plan), each sender paced for
        # its own message as there; taken whole here, once, rather than n times.
        planned, _, planned_s, _ = self.planner.whole_plan(self.control.view_for(rnd), rnd, self.message_bytes, sizes)
        plan = {i: [j for j, _, _ in rs] for i, rs in planned.items()}
        src = np.array([i for i, rs in planned.items() for _ in rs], dtype=np.int64)
        dst = np.array([j for rs in planned.values() for j, _, _ in rs], dtype=np.int64)
        cap = np.array([rate for rs in planned.values() for _, rate, _ in rs], dtype=float)
        probes = {(i, j): probe for i, rs in planned.items() for j, _, probe in rs}
        t0 = float(send_at.min())
        up, down, loss = self.links.at(t0)
        view = NetworkView(up, down, sizes, np.ones(self.n, dtype=bool))
        bounds, shares, deadline = self.round_bounds(rnd, sizes, planned_s)
        sim = PlannedSimulator(view, plan, (src, dst, cap), loss=loss, bound=bounds, layer_shares=shares,
                                deadline=deadline, slow_close=self.options.slow_close, compute_s=send_at - t0,
                                links=self.links.from_time(t0))
        f = sim.run(1).flows
        fsrc, fdst = f["src"].astype(int), f["dst"].astype(int)
        self._report(rnd, fsrc, fdst, f["cap"], f["rate"] * (1 - loss[fdst]), [probes[(i, j)] for i, j in zip(fsrc, fdst)],
                     sizes)
        done = send_at.copy()
        np.maximum.at(done, fsrc, t0 + f["end_s"])
        if self.log is not None:
            self.log.sends(done - send_at, fsrc, f["slow"])
        if self.tolerance is None:
            layer_delivered = f["delivered"][:, None]
        else:
            layer_delivered = self.tolerance.layer_delivered(fsrc, loss[fdst], f["delivered"], bounds)
            self.tolerance.observe(rnd, fsrc, f["delivered"], loss[fdst], f["end_s"] - f["start_s"], f["slow"],
                                   done - send_at, sizes)
        return {"round": np.full(len(fsrc), float(rnd)), "src": fsrc.astype(float), "dst": fdst.astype(float),
                "arrival": t0 + f["end_s"], "delivered": f["delivered"], "layer_delivered": layer_delivered,
                "slow": f["slow"], "flow_s": f["end_s"] - f["start_s"]}, done, planned_s, deadline

    def _merge(self, current: int, pending: dict[str, np.ndarray], taken: np.ndarray, messages: dict[int, np.ndarray],
               anchors: np.ndarray | None) -> None:
        """Merge the `taken` deliveries into their receivers' replicas after round `current` (C merge,
        chunk masks), then each receiver's outer update."""
        own = self.replicas.numpy()
        by_receiver: dict[int, list] = {}
        taken = np.flatnonzero(taken)
        # in training's order (`sync.merge.OrderedFolds`): the round's senders first (all expected: one
        # plan for every peer), by rank, then older rounds' by round and sender
        rounds = pending["round"][taken]
        for k in taken[np.lexsort((pending["src"][taken], rounds, rounds != current))].tolist():
            rnd, src, delivered = int(pending["round"][k]), int(pending["src"][k]), float(pending["delivered"][k])
            dst = int(pending["dst"][k])
            if self.messages is None:
                got = self.arrivals.plain(src, dst, rnd, messages[rnd][src], delivered, pending["layer_delivered"][k])
            else:
                got = self.arrivals.delivery(src, dst, rnd, *self.messages.sent(rnd, src), delivered)
            if got is None:
                continue
            by_receiver.setdefault(dst, []).append((src, got))
        for i, received in sorted(by_receiver.items()):
            contributions, robust = [c for _, c in received], self.robust[i] if self.robust else None
            if self.messages is not None:
                self.messages.merge(own[i], contributions, robust)
            elif robust is not None:
                robust.merge_parameter(0, own[i], contributions, [src for src, _ in received])
            else:
                merge_parameter(own[i], contributions)
            if anchors is not None:
                self.outer[i].step([own[i]], [anchors[i]])

    def _result(self, history, rounds, clock, wall_s: float) -> dict:
        test = (self.data.x_test, self.data.y_test)
        s = self.settings
        return {"peers": self.n, "parameters": self.replicas.parameters, "replica_bytes": self.replica_bytes,
                "message_bytes": self.message_bytes,
                "message_bytes_source": "--message-bytes" if s.message_bytes else "the replica's",
                "costs": self.costs, "virtual_s": float(clock.max()), "mean_virtual_s": float(clock.mean()), "wall_s": wall_s,
                "rounds": len(rounds), "average_p": float(np.mean([r["average_p"] for r in rounds])) if rounds else 0.0,
                "delivered": float(np.mean([r["delivered"] for r in rounds])) if rounds else 1.0,
                "own_accuracy": self.replicas.accuracy(self.replicas.flat[0], *test),
                "averaged_accuracy": self.replicas.accuracy(self.replicas.flat.mean(0), *test), "history": history, "round_log": rounds,
                "slow_closed": sum(r["slow"] for r in rounds), "send_over_plan": _send_over_plan(rounds),
                "model": "virtual time: flow-level network (one round's flows share the links), link rates "
                         "changing as bursts begin and end, loss as at a round's start, calibrated compute; "
                         "training's merge rule; " + self.hosts.describe(self.n)}
