"""One communication round per optimizer step: plan, send, gather, merge, report.

    1. plan this round locally from the view the control plane pushed (receivers with pacing
       rates, senders to me): no request to anyone on the step's path;
    2. ask the tolerance policy for per-layer loss bounds and a deadline;
    3. multicast the parameters (plain, compressed, or the value-filtered part of them: the
       message `MessageCodec` encodes) through the engine;
    4. gather what the round's rule allows (BSP: this round from every live sender, or the
       round's limit; SSP: whatever arrived within the staleness bound);
    5. read each delivery back through the codec as it comes, merge per element with the delivery
       masks (folded while the round waits idle: `sync.merge.OrderedFolds`), in place, then (given an outer optimizer) take the outer step on the merged change since the
       last round;
    6. report the round's measurements and the new clock (one-way), which feed later views.
The engine reads the parameters in place, so they are written only once this peer's own send is done.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from p2plearn.filter import UpdateFilter
from p2plearn.protocols import ControlClient, DataChannel
from p2plearn.sync.bfloat16 import values
from p2plearn.sync.change import change_norm
from p2plearn.sync.codec import Contributions, MessageCodec, filtered_arrays, filtered_contributions
from p2plearn.sync.compress import Compressor
from p2plearn.sync.fragments import Fragments
from p2plearn.sync.inbox import Inbox
from p2plearn.sync.merge import OrderedFolds, nonfinite
from p2plearn.sync.outer import OuterOptimizer
from p2plearn.sync.planner import RoundPlanner
from p2plearn.sync.reused import ReusedArrays
from p2plearn.sync.robust import RobustMerge
from p2plearn.sync.window import AHEAD_ROUNDS, RECENT_ROUNDS, MergeWindow
from p2plearn.tolerance import Layer, NetworkState, RoundRecord, TolerancePolicy, TrainingState
from p2plearn.tolerance.base import CUT_RESULTS
from p2plearn.transport import Delivery

# filtered_arrays, filtered_contributions: the value-filtered format's, imported from here before the codec;
# AHEAD_ROUNDS: the merge window's (sync.window), imported from here before it
__all__ = ["AHEAD_ROUNDS", "RoundStats", "Synchronizer", "filtered_arrays", "filtered_contributions"]

log = logging.getLogger("p2plearn.sync")




@dataclass(kw_only=True)
class RoundStats:
    """What one round did, from this peer's side (built by keyword: its fields are many and alike)."""

    round: int
    receivers: list[int]
    senders: list[int]
    merged: int                 # messages merged (BSP: of this round; SSP: within the bound)
    delivered: float            # mean fraction of the merged messages' elements that arrived
    fanout: float               # the plan's average p
    planned_s: float            # T of the plan
    comm_s: float               # wall time of the round's communication
    send_s: float               # this peer's own transfer: until its slowest receiver closed
    bytes_sent: int             # message bytes on this peer's uplink: one copy per unicast receiver, one for its group
    retransmitted: int          # datagrams this peer sent again (loss it did not tolerate)
    results: dict[str, int] = field(default_factory=dict)  # per-receiver send results, counted
    merged_from: list[int] = field(default_factory=list)   # the senders whose messages were merged


def _copies(sent: list) -> int:
    """Copies of a message on the sender's uplink: one per unicast receiver, one for all through the group."""
    grouped = sum(st.multicast for st in sent)
    return len(sent) - grouped + (grouped > 0)


class Synchronizer:
    """Shared round machinery, waiting as BSP does; subclasses may decide otherwise what to wait
    for and merge early (`_wait_round`, `_gather`: `SSP`) or run rounds of their own (`step`: `Partitioned`).

    Args:
        params: numpy arrays holding the model (the buckets of `p2plearn.train.buckets`, or one
            array per tensor); merged in place. A round's Python work grows with their number.
        layers: one `Layer` per tensor of the model (for the tolerance policy and the filter).
        layer_ranges: where each layer sits: (array, first element, end element) of `params`,
            in order inside each array; None: layer i is the whole of params[i]. Per-layer loss
            bounds map to these ranges: the message splits an array where its layers' bounds
            differ, so each bound covers its layer's bytes.
        channel: the peer's `Channel` (or `TcpChannel`, or any `DataChannel`).
        client: the peer's control-plane `Client` (or any `ControlClient`), registered, with the
            engine address.
        selection, fanout, seed: the selection policy's name, p, and tie-break seed.
        tolerance: decides per-layer bounds and the round deadline.
        slow_close: S for every round's sends (`Channel.send`'s slow_close; `Options.slow_close`):
            a receiver whose arrivals put its end past S times its planned time is closed with
            what it got (result "slow"), so a burst on one downlink costs the round at most S x
            its plan; 0 = off. Its receiver merges what arrived (a missing chunk keeps its own
            value), as after a deadline.
        value_filter: when given, only what it lets through is sent: the elements (or layers)
            whose accumulated change crossed its threshold, carrying their current values;
            receivers average just those and keep their own values elsewhere.
        outer: the outer update on each round's averaged change (DiLoCo); None averages plainly.
            With fragments, a round's outer step and new anchor are its fragment's arrays' only.
        fragments: F; round r exchanges only fragment r mod F of the arrays (see
            `p2plearn.sync.fragments`; at least F arrays; no value filter); 1: every array every round.
        compress: "none", or the format values travel in ("fp16", "bf16", "int8", "int4"; see
            `p2plearn.sync.compress`), with error feedback.
        keep_nonfinite: compressed rounds merge a sender's NaN and inf values (and the int8/int4
            scales that make them) as they come; by default they count as not arrived (this peer
            keeps its own value there) and are counted per sender in ``nonfinite``.
        policy_options: the selection policy's own options (SELMCAST: max_fanout, mixing_slack).
        transport_mode: the channel's (``unicast``, ``multicast`` or ``auto``): which receivers a
            plan counts one copy for on their sender's uplink (see ``RoundPlanner``); each send then
            goes through the sender's group to the receivers the plan groups, by unicast to the
            others. Every peer must give the same value (they plan alike).
        round_cap_s: the longest any round may wait for inputs; a safety net against hangs, not a
            tuning knob. Without a deadline a BSP round waits for an expected sender at most
            LATE_SENDER times the median of recent rounds (at least MIN_WAIT_S): a sender that
            planned from another view, or stalled, costs one bounded round, not the cap.
    """

    robust: RobustMerge | None = None  # BSP and SSP take one (--robust); None merges plainly

    def __init__(self, params: list[np.ndarray], layers: list[Layer], channel: DataChannel, client: ControlClient, *,
                 selection: str, fanout: int, seed: int, tolerance: TolerancePolicy,
                 value_filter: UpdateFilter | None = None, outer: OuterOptimizer | None = None,
                 compress: str = "none", round_cap_s: float = 30.0, start_clock: int = 0,
                 policy_options: dict | None = None, transport_mode: str = "unicast",
                 layer_ranges: list[tuple[int, int, int]] | None = None, fragments: int = 1,
                 slow_close: float = 0.0, keep_nonfinite: bool = False):
        if not all(p.flags.c_contiguous for p in params):
            raise ValueError("the synchronizer merges in place: its arrays must be C-contiguous")
        self.params = [p.reshape(-1) for p in params]  # 1-D views: layers are element ranges of them
        self.layers = layers
        self.layer_ranges = layer_ranges or [(i, 0, p.size) for i, p in enumerate(self.params)]
        if len(self.layer_ranges) != len(layers):
            raise ValueError(f"{len(self.layer_ranges)} layer ranges for {len(layers)} layers")
        if fragments > 1 and value_filter is not None:
            raise ValueError("--fragments: does not apply with --filter value (the filter picks what travels per "
                             "layer, from the whole model's change)")
        self.fragments = Fragments([p.nbytes for p in self.params], fragments)
        self.channel = channel
        self.client = client
        self.tolerance = tolerance
        self.slow_close = slow_close
        self.filter = value_filter
        self.outer = outer
        # the codec encodes with the compressor (its residuals advance there); state_dict saves them
        self.compressor = Compressor(compress, [p.size for p in params], keep_nonfinite) if compress != "none" else None
        self.codec = MessageCodec(self.params, self.layer_ranges, self.fragments, compressor=self.compressor,
                                  value_filter=value_filter)
        self.round_cap_s = round_cap_s
        self.window = MergeWindow(round_cap_s=round_cap_s)  # which deliveries merge when (SSP sets its own)
        self.clock = start_clock
        self._joined = start_clock > 0  # took part from a running job's clock (a joiner, a restarted peer)
        self.planner = RoundPlanner(selection, fanout, seed, transport_mode, **(policy_options or {}))
        self.inbox = Inbox(channel, self._wanted_rounds, lambda: len(self.client.members) if self.client else 0)
        self._interrupted = False
        self.network = NetworkState()
        self.training = TrainingState()
        # The model as last merged (the anchor), kept only where something reads it: an outer step
        # that is not plain averaging, compressed changes, the filter, a policy that reads update norms. Else no copy of the model
        # (its memory) and no copy into it each round (its time).
        anchored = (outer is not None and not outer.plain) or self.compressor is not None \
            or value_filter is not None or tolerance.reads_update_norms
        self._previous: list[np.ndarray] | None = [p.copy() for p in self.params] if anchored else None
        # This peer's load, reported every round (see GlobalView): its compute between rounds,
        # merge time per message, and messages kept for a later round's merge.
        self._round_end: float | None = None
        self._compute_s = 0.0
        self._merge_s = 0.0
        self._backlog = 0
        self._probes: dict[int, str] = {}  # this round's flows that probe an end (see selection.view)
        self._fragment_bytes: dict[int, int] = {}  # per fragment, its last message's bytes
        self.nonfinite: Counter[int] = Counter()  # per sender, its values refused as not finite
        self._scratch = ReusedArrays()  # the merge's running sums, kept across rounds
        self._cut: Counter[str] = Counter()  # sends cut short over the job, by result (deadline, slow): reported

    def step(self, loss: float | None = None) -> RoundStats:
        """Run one round; returns its stats. Call it after each local optimizer step."""
        rnd = self.clock
        carried = self.fragments.arrays(rnd)
        t0 = time.monotonic()
        self._computed_until(t0)
        deltas = self._track_updates(loss)
        message = self.codec.encode(rnd, carried, deltas)
        self.network.expected_bytes = message.nbytes
        view = self.client.view_for(rnd)
        plan = self.planner.plan(view, rnd, self.client.rank, self.network.expected_bytes)
        self.network.planned_time_s = plan.planned_time
        self._probes = plan.probes
        bounds, deadline = self.tolerance.bounds(rnd, self.layers, self.network, self.training)
        members = self.client.members
        receivers = [(j, rate) for j, rate in plan.receivers if j in members and members[j].engine]
        arrays, wire_bounds = self.codec.wire(message, bounds)
        handle = self.channel.send(rnd, arrays, [(*members[j].engine, rate) for j, rate in receivers],
                                   loss_bounds=wire_bounds, deadline=deadline, slow_close=self.slow_close,
                                   multicast=[j in plan.grouped for j, _ in receivers])
        self._interrupted = False
        # A peer that joined holds no view older than the one it was given: for the rounds before
        # that view applies, the others plan with another, so it cannot know its senders: it waits
        # for none and merges what has come (a receiver accepts any sender).
        expected = set(plan.senders) if view is None or view.from_round <= rnd else set()
        merge = self._begin_merge(rnd, expected)
        self._wait_round(rnd, expected, t0 + self._wait_limit(deadline), merge)
        sent = handle.wait()
        comm_s = time.monotonic() - t0
        self.clock = rnd + 1
        self._report(rnd, receivers, sent, comm_s, loss, deadline)
        self._gather(rnd, merge)
        merged_from = sorted({sender for _, sender in merge.keys})
        merged, delivered = self._merge(merge)
        self._backlog = self.inbox.pending()
        self._outer_step(carried)
        self._round_end = time.monotonic()
        return RoundStats(round=rnd, receivers=[j for j, _ in receivers], senders=plan.senders, merged=merged,
                          delivered=delivered, fanout=plan.fanout, planned_s=plan.planned_time, comm_s=comm_s,
                          send_s=max((st.elapsed_s for st in sent), default=0.0),
                          bytes_sent=self.network.expected_bytes * _copies(sent),
                          retransmitted=sum(st.retransmitted for st in sent),
                          results=dict(Counter(st.result for st in sent)), merged_from=merged_from)

    def _outer_step(self, carried: list[int]) -> None:
        """The outer update of the arrays the round carried, from their anchors (the model as last
        merged), which then become these arrays' values; the other arrays keep theirs."""
        if self._previous is None:
            return
        if self.outer is not None:
            self.outer.step(self.params, self._previous, carried)
        for i in carried:
            np.copyto(self._previous[i], self.params[i])  # in place: no second copy of the model, even briefly

    def adopt(self, clock: int) -> None:
        """The arrays now hold another peer's model, sent before its round `clock` (a joiner's or a
        rejoiner's state): this peer goes on from that round, with that model as the anchor."""
        self.clock = clock
        for anchor, p in zip(self._previous or [], self.params):
            np.copyto(anchor, p)

    def take_state(self, sender: int | None, until: float) -> Delivery | None:
        """A whole-model message (an id with `STATE_FLAG`: a joiner's state, a final model) from
        `sender`, or from anyone, waiting for one until the monotonic `until`; an `until` already
        past takes only what the engine has delivered by now (all of it is filed first)."""
        if until <= time.monotonic():
            self.inbox.drain()
        return self.inbox.take_state(sender, until)

    def keep_states(self, senders: int) -> None:
        """Keep whole-model messages unasked for from at least `senders` senders (by default from
        MAX_STATES, or as many as there are members): the root of a final average takes one from
        every rank of the job, also from those that left it once they sent theirs."""
        self.inbox.states_kept = max(self.inbox.states_kept, senders)

    def state_dict(self) -> dict[str, Any]:
        """What resuming exactly needs: the round clock, the model as last merged (the filter's
        and policies' updates are measured from it), the histories the policies read, and the
        policy's and filter's own state. Plain values and numpy arrays. Without an anchor (nothing
        reads one) the model itself is saved as "previous": a resume with options that read it
        measures changes from there."""
        return {"clock": self.clock, "previous": [p.copy() for p in self._previous or self.params],
                "history": [asdict(r) for r in self.network.history], "training": asdict(self.training),
                "tolerance": self.tolerance.state_dict(),
                "filter": self.filter.state_dict() if self.filter is not None else None,
                "outer": self.outer.state_dict() if self.outer is not None else None,
                "compressor": self.compressor.state_dict() if self.compressor is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        previous = state["previous"]
        if [p.shape for p in previous] != [p.shape for p in self.params]:
            raise ValueError(f"the state is of a model with tensors {[p.shape for p in previous]}, not this one's "
                             f"{[p.shape for p in self.params]}")
        self.clock = int(state["clock"])
        if self._previous is not None:
            self._previous = [np.array(p, dtype=own.dtype).view(type(own)) for p, own in zip(previous, self.params)]
        self.network.history = [RoundRecord(**r) for r in state["history"]]
        self.training = TrainingState(**state["training"])
        self.tolerance.load_state_dict(state["tolerance"])
        if self.filter is not None and state["filter"] is not None:
            self.filter.load_state_dict(state["filter"])
        if self.outer is not None and state.get("outer") is not None:
            self.outer.load_state_dict(state["outer"])
        if self.compressor is not None and state.get("compressor") is not None:
            self.compressor.load_state_dict(state["compressor"])

    @property
    def staleness(self) -> int:
        """Rounds a peer may run ahead of the slowest (the merge window's; 0 but for SSP)."""
        return self.window.staleness

    def _wanted_rounds(self) -> tuple[int, int]:
        """Rounds whose messages are worth keeping (`MergeWindow.wanted`)."""
        return self.window.wanted(self.clock)

    def interrupt(self) -> None:
        """End the current round's wait early (this peer's state is about to be replaced)."""
        self._interrupted = True

    def _wait_limit(self, deadline: float | None) -> float:
        """How long this round may wait for its senders (`MergeWindow.wait_limit`, from this peer's
        recent rounds)."""
        return self.window.wait_limit(deadline, [r.elapsed_s for r in self.network.history[-RECENT_ROUNDS:]],
                                      joined=self._joined, planned_s=self.network.planned_time_s)

    def _hold(self, target: int, until: float, idle: Callable[[], None] | None = None) -> bool:
        """Wait until the slowest live peer's clock reaches ``target`` (the control plane's clock);
        False if it did not within the round cap. While the coordinator is silent that clock is
        stale: then `MergeWindow.stands_in` may end the wait at the monotonic ``until`` (the round's
        own limit) or on a message heard from a peer at ``target`` or later. ``idle`` is called after
        each poll of the clock that did not end the wait."""
        cap = time.monotonic() + self.round_cap_s
        while not self._interrupted and not self.client.wait_min_clock(target, timeout=0.05):
            self.inbox.drain()  # keep the engine's queue short while waiting
            if idle is not None:
                idle()
            if time.monotonic() > cap:
                return False
            if self.window.stands_in(target, clock_current=self.client.clock_current,
                                     newest_heard=max(self.inbox.newest.values(), default=-1),
                                     now=time.monotonic(), until=until):
                return True
        return True

    def _begin_merge(self, rnd: int, expected: set[int]) -> OrderedFolds:
        """Round `rnd`'s merge, offered each message as it comes (keys (round, sender): round rnd's
        `expected` senders first, in rank order, then the others by round and sender). It folds
        before the end only plain and value-filtered values merged plainly: compressed ones cost more
        in running sums than they merge (`OrderedFolds`), the robust merge needs every sender at once."""
        early = self.compressor is None and self.robust is None
        return OrderedFolds(self.codec.targets, [(rnd, s) for s in sorted(expected)], self._scratch, early)

    def _wait_round(self, rnd: int, senders: set[int], until: float, merge: OrderedFolds) -> None:
        """Block, while this peer's own send is in flight, for what the rule requires (BSP's rule:
        round `rnd`'s messages, offered to `merge` as they come and folded while the wait is idle;
        then the slowest clock that keeps this round's message wanted)."""
        for d in self.inbox.arrivals(rnd, senders, until, self._alive):
            if d is None:
                merge.fold_due()
            else:
                self._offer(merge, d)
        self._hold(self.window.hold_target(rnd), until)

    def _gather(self, rnd: int, merge: OrderedFolds) -> None:
        """Offer `merge` the rest of what round `rnd` merges (this peer's clock is now rnd + 1)."""
        self.inbox.drain()
        for d in self.inbox.take(*self.window.merged(rnd)):
            self._offer(merge, d)

    def _offer(self, merge: OrderedFolds, d: Delivery) -> None:
        """Offer delivery d to the round's merge, read through the codec; an unusable one, or a second
        one of a round from one sender, is counted in the inbox's drops."""
        contributions = self._contributions(d)
        if contributions is not None and not merge.offer((d.msg_id, d.sender), contributions):
            self.inbox.drop("a second message for one round", d.sender)

    def _alive(self, rank: int) -> bool:
        """Whether an expected sender is still worth waiting for."""
        return rank in self.client.members and not self._interrupted

    def array_bounds(self, bounds: list[float]) -> list[float]:
        """Per array, the smallest bound of its layers (`MessageCodec.array_bounds`)."""
        return self.codec.array_bounds(bounds)

    def _contributions(self, d: Delivery) -> Contributions | None:
        """Per merge target, what delivery d brings; None if d is unusable (dropped, counted in the
        inbox's drops under the codec's reason)."""
        out, problem = self.codec.read(d)
        if problem:
            self.inbox.drops[problem] += 1  # unmergeable: a peer's bug or a hostile key holder
        return out

    def _computed_until(self, t0: float) -> None:
        """A round starts at t0: the time since the last one ended was this peer's compute."""
        if self._round_end is not None:
            self._compute_s = t0 - self._round_end

    def _merge(self, merge: OrderedFolds) -> tuple[int, float]:
        """Finish the round's merge, in place: the messages merged and the mean fraction of their
        elements that arrived, over the arrays their rounds carried."""
        t0 = time.monotonic()
        keys = merge.keys
        if not keys:
            return 0, 1.0
        targets = self.codec.targets
        # the arrays the messages' rounds carried (every target with one fragment): each delivery
        # merges into its own round's fragment only (SSP merges several rounds at once)
        carried = range(len(targets)) if self.fragments.count == 1 else \
            sorted({t for rnd, _ in keys for t in self.fragments.arrays(rnd)})
        if self.robust is None:
            every = merge.finish()
            fractions, refused = [every[i] for i in carried], merge.refused
        else:
            pending = merge.pending()
            fractions = []
            for i in carried:
                got = [(sender, c[i]) for (_, sender), c in pending if c[i] is not None]
                fractions.append(self.robust.merge_parameter(i, targets[i], [c for _, c in got], [s for s, _ in got]))
            refused = {key: nonfinite(c) for key, c in pending}
        for (_, sender), count in refused.items():
            self._count_nonfinite(sender, count)
        self._scratch.settle()  # once a round: what the round did not use goes
        self._merge_s = (time.monotonic() - t0) / len(keys)
        return len(keys), float(np.mean(fractions))

    def _count_nonfinite(self, sender: int, refused: int) -> None:
        """Count the values merging (or decoding) a sender's message refused as not finite (a
        diverged peer, or a hostile key holder); one line the first time per sender."""
        if not refused:
            return
        if sender not in self.nonfinite:
            log.warning("refused %d non-finite values from rank %d (this peer keeps its own there, as for a "
                        "lost chunk); further ones are counted in the synchronizer's nonfinite", refused, sender)
        self.nonfinite[sender] += refused

    def _track_updates(self, loss: float | None) -> list[np.ndarray] | None:
        """The model's change since the last round, when the filter reads it (else None), and its
        norms per layer when the tolerance policy reads them, measured in C without a copy of the model."""
        deltas = [values(p) - values(q) for p, q in zip(self.params, self._previous)] if self.filter is not None else None
        if self.tolerance.reads_update_norms:
            self.training.record_update([change_norm(self.params[a][lo:hi], self._previous[a][lo:hi])
                                         for a, lo, hi in self.layer_ranges])
        if loss is not None:
            self.training.record_loss(loss)
        return deltas

    def _report(self, rnd: int, receivers: list[tuple[int, float]], sent: list, comm_s: float,
                loss: float | None, deadline: float | None) -> None:
        # Per receiver: the pace and what arrived, as the receiver's ACKs timed it (the estimator
        # tells a bottleneck from our own pacing by comparing the two).
        links = {j: {"paced": rate, "rate": st.ack_rate, "probe": self._probes.get(j, ""), "multicast": st.multicast}
                 for (j, rate), st in zip(receivers, sent)}
        engine = self.channel.stats()
        load = {"compute_s": self._compute_s, "merge_s": self._merge_s, "backlog": self._backlog,
                "in_flight_bytes": engine.get("receiving_bytes", 0), "in_flight_msgs": engine.get("receiving_messages", 0)}
        # The size the view plans every round with: the largest fragment's, steady from round to
        # round (a size that alternated would publish a new view, and risk a round, every round).
        self._fragment_bytes[self.fragments.of_round(rnd)] = self.network.expected_bytes
        self._cut.update(st.result for st in sent if st.result in CUT_RESULTS)
        counts = {**self._cut, **{name: n for name, n in engine.items() if name.startswith("drop_") and n}}
        self.client.report(rnd + 1, loss=loss, step_time=comm_s, links=links, load=load,
                           message_bytes=max(self._fragment_bytes.values()), counts=counts)
        self.network.record(RoundRecord.of_sends(rnd, comm_s, sent, self.network.expected_bytes))
