"""`DecentralizedOptimizer`: a torch optimizer whose `step()` is a local step, and every
`--period` steps also a communication round (overlapped with the next steps under `--overlap`;
with `--fragments F`, a round of one fragment of the model every period / F steps).

    import p2plearn
    rt = p2plearn.init()                        # rank, size, options from the launcher or mpirun/srun
    opt = p2plearn.DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model)
    for x, y in p2plearn.data.shard(train_set, batch_size=32):
        loss = F.cross_entropy(model(x), y); loss.backward(); opt.step(loss=loss); opt.zero_grad()
    print(opt.stats())
    opt.close()

It behaves as the optimizer it wraps: `param_groups`, `state` and `defaults` are the wrapped
optimizer's own (LR schedulers and gradient clipping act on it), `state_dict()` holds its state
plus this peer's round state, `step(closure)` returns the closure's loss, and `GradScaler.step`
works (a step skipped for inf/NaN gradients still takes part in its round).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.optim import Optimizer

from p2plearn.control import ControlError
from p2plearn.options import Options
from p2plearn.protocols import DataChannel
from p2plearn.runtime import Runtime, init
from p2plearn.selection import NetworkView, plan_flows
from p2plearn.sync import SYNCHRONIZERS, RoundStats, Synchronizer
from p2plearn.sync.bfloat16 import bf16_values, values
from p2plearn.sync.fragments import Fragments, fragment_pieces
from p2plearn.sync.inbox import MAX_STATES, STATE_FLAG
from p2plearn.sync.outer import OuterOptimizer
from p2plearn.filter import make_filter
from p2plearn.keys import data_key
from p2plearn.tolerance import Layer, policy_from_options
from p2plearn.train.buckets import Buckets
from p2plearn.train.reach import MulticastReach
from p2plearn.train.staging import HostStaging
from p2plearn.transport import CHUNK_CLAIM, Channel, message_bytes

log = logging.getLogger("p2plearn.train")
ASK_AGAIN_S = 10.0  # a joiner without its state after this long asks for another donation
STATE_POLL_S = 0.2  # how often a joiner waiting for its state looks whether its donor or the job is gone
FINAL_ID = STATE_FLAG | (STATE_FLAG - 1)  # the message id of a final model: no round or join uses it
NORM_TYPES = (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm)


class JobEnded(SystemExit):
    """The job ended before this peer finished: it was stopped or stalled while the others trained to
    the end and left, so no peer is left to send it the model, and its own is stale. Uncaught, Python
    prints its one line and exits with code 1, as for any rank that could not finish its part."""


@dataclass
class TrainingStats:
    """What `DecentralizedOptimizer.stats()` reports; ``str()`` is the one-line summary."""

    rounds: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    retransmitted: int = 0          # datagrams sent again: the loss the bounds did not tolerate
    average_p: float = 0.0          # the plans' average fanout
    receivers_per_round: float = 0.0  # this peer's own receivers per round
    delivered: float = 1.0          # mean fraction of merged messages that arrived
    merged_per_round: float = 0.0
    comm_s: float = 0.0             # wall time in communication rounds
    compute_s: float = 0.0          # wall time outside them (forward, backward, local step, data)
    merges: int = 0                 # messages merged, over all rounds
    mixed_with: set[int] = field(default_factory=set)  # the peers whose messages were merged
    rejoins: int = 0                # times this peer was taken for dead, came back and got the state again
    coordinator_changes: int = 0    # failovers this peer followed
    nonfinite: int = 0              # values of compressed messages refused as NaN or inf (--keep-nonfinite keeps them)
    round_times: list[float] = field(default_factory=list)
    send_times: list[float] = field(default_factory=list)  # per round, this peer's own transfer

    def __str__(self) -> str:
        return self.summary()  # print(opt.stats()): one line; the per-round lists stay attributes

    def summary(self) -> str:
        """One line: what this peer did."""
        mixed = ",".join(map(str, sorted(self.mixed_with))) or "none"
        return (f"{self.rounds} rounds, {self.merges} merges, mixed with {len(self.mixed_with)} peers ({mixed}), "
                f"{self.bytes_sent / 1e6:.1f} MB sent, comm {self.comm_s:.1f} s / compute {self.compute_s:.1f} s, "
                f"{self.rejoins} rejoins, {self.coordinator_changes} coordinator changes"
                + (f", {self.nonfinite} non-finite values refused" if self.nonfinite else ""))


def exchanged_tensors(model: torch.nn.Module, buffers: bool = True) -> dict[str, torch.Tensor]:
    """What peers average, by state-dict name: every parameter, then (``buffers``) every floating
    buffer, such as BatchNorm's running mean and variance. Integer buffers (BatchNorm's
    ``num_batches_tracked``) stay local: each counts this peer's own batches."""
    tensors = dict(model.named_parameters())
    if buffers:
        tensors.update((name, b) for name, b in model.named_buffers() if b.is_floating_point())
    return tensors


def describe_layers(model: torch.nn.Module, buffers: bool = False) -> list[Layer]:
    """One Layer per exchanged tensor (see `exchanged_tensors`), in its order; norm parameters and
    buffers marked "norm", biases "bias"."""
    kinds = {}
    for module in model.modules():
        for name, t in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            kinds[id(t)] = "norm" if isinstance(module, NORM_TYPES) else ("bias" if name == "bias" else "weight")
    return [Layer(name=name, numel=t.numel(), nbytes=t.numel() * t.element_size(), depth=i,
                  kind=kinds.get(id(t), "weight"))
            for i, (name, t) in enumerate(exchanged_tensors(model, buffers).items())]


def layers_on_pieces(layers: list[Layer], ranges: list[tuple[int, int, int]],
                     pieces: list[tuple[int, int, int]]) -> tuple[list[Layer], list[tuple[int, int, int]]]:
    """`layers` (one per tensor, at (bucket, start, end) `ranges`) as the rounds see them on
    `pieces` ((bucket, start, end) each): a tensor cut between pieces becomes one layer per part
    (named with its element range), each with its range in its piece."""
    out, out_ranges = [], []
    for layer, (bucket, start, end) in zip(layers, ranges):
        parts = [(p, max(start, lo), min(end, hi)) for p, (b, lo, hi) in enumerate(pieces)
                 if b == bucket and max(start, lo) < min(end, hi)] or [(_piece_at(pieces, bucket, start), start, end)]
        for p, lo, hi in parts:
            name = layer.name if len(parts) == 1 else f"{layer.name}[{lo - start}:{hi - start}]"
            itemsize = layer.nbytes // max(1, layer.numel)
            out.append(dataclasses.replace(layer, name=name, numel=hi - lo, nbytes=(hi - lo) * itemsize))
            out_ranges.append((p, lo - pieces[p][1], hi - pieces[p][1]))
    return out, out_ranges


def _piece_at(pieces: list[tuple[int, int, int]], bucket: int, element: int) -> int:
    """The piece holding `element` of `bucket` (an empty tensor's place: the piece it starts in or ends)."""
    return next(p for p, (b, lo, hi) in enumerate(pieces) if b == bucket and lo <= element <= hi)


def _to_torch(value: Any) -> Any:
    """numpy arrays inside a (nested) state become tensors: ``torch.load(weights_only=True)`` reads them."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, (list, tuple)):
        return type(value)(_to_torch(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_torch(v) for k, v in value.items()}
    return value


def _to_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.numpy().copy()
    if isinstance(value, (list, tuple)):
        return type(value)(_to_numpy(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_numpy(v) for k, v in value.items()}
    return value


def _emulated_link(options: Options, rank: int) -> tuple[float, float]:
    """(uplink bytes/s, loss) of this rank's node in the topology, for --emulate."""
    from p2plearn.topology import load

    topo = load(options.topology)
    nodes = [peer for peer in topo.peers for _ in range(topo.slots(peer))]
    if rank >= len(nodes):
        raise ValueError(f"{options.topology} has {len(nodes)} peer slots, rank {rank} has none")
    return topo.uplink_bytes_per_s(nodes[rank]), topo.loss(nodes[rank])


class DecentralizedOptimizer(Optimizer):
    """Local steps with `optimizer`; every `period` steps a communication round averages with other peers.

    Options that shape the schedule (flags, or keyword overrides here): ``period`` (H local steps
    per round), ``outer_lr`` and ``outer_momentum`` (the outer update on each round's averaged
    change, DiLoCo-style; 1 and 0 average plainly), ``overlap`` (the round runs in the background
    while the next H steps compute; its merge is added to the parameters as a change when the
    next round starts, so a step waits only for a round longer than the period), ``overlap_steps``
    (tau: the round lands after tau steps instead, so its result is tau steps late, not a period;
    try the fewest steps whose compute covers a round's transfer), ``overlap_alpha`` (how it lands:
    none adds its change, alpha in (0, 1] mixes (1 - alpha) x local + alpha x result), ``fragments``
    (F: a round every period / F steps, each carrying one fragment of the buckets in turn; see
    `p2plearn.sync.fragments`).

    The exchanged tensors are packed into contiguous buckets (``bucket_mb``, one per dtype at
    least): each parameter and floating buffer becomes a view of its bucket, so a round reads and
    merges a few large arrays. Do not move the model (``model.to(...)``) after wrapping it: that
    would give it new tensors outside the buckets. A model on CUDA (or any torch device) is
    averaged through host buffers (see `p2plearn.train.staging`); ``staging="host"`` makes a CPU
    model take the same path.

    Args:
        optimizer: any torch optimizer over `model`'s parameters (tensors on any device, of any
            float dtype: float32, float16, bfloat16, float64; they travel in their own dtype and
            are merged in float64).
        model: the model whose parameters (and floating buffers) are exchanged.
        runtime: from `p2plearn.init()`; made here when not given.
        engine: a channel to use instead of creating one (a `Channel`, or the TCP baseline's
            `TcpChannel`); the caller closes it.
        buffers: also average floating buffers (BatchNorm's running statistics) with the
            parameters; False keeps them local to each peer.
        seed: tie-break seed of the selection policy; the same on every peer.
        overrides: option values over the runtime's (sync, staleness, selection, fanout,
            loss_bound, tolerance, deadline_ms, ...): see `p2plearn.options.Options`.

    After each step, `last_round` has what the round did (a `RoundStats`); `stats()` the totals.
    """

    # GradScaler.step hands this optimizer `grad_scale` and `found_inf` instead of skipping the
    # call on inf/NaN gradients: the local step is skipped, the round is not (BSP peers wait for it).
    _step_supports_amp_scaling = True

    def __init__(self, optimizer: Optimizer, model: torch.nn.Module, runtime: Runtime | None = None,
                 *, engine: DataChannel | None = None, buffers: bool = True, seed: int = 0, **overrides: Any):
        self.optimizer = optimizer
        # torch's Optimizer machinery (step hooks, profiling) without Optimizer.__init__, which
        # would make param groups of its own: param_groups and state are the wrapped optimizer's.
        Optimizer.__setstate__(self, {})
        self.model = model
        self.runtime = runtime or init()
        self.options = self.runtime.options.replace(**overrides) if overrides else self.runtime.options
        exchanged = exchanged_tensors(model, buffers)
        self.buckets = Buckets(exchanged, max(1, int(self.options.bucket_mb * 2**20)))
        self.tensors = {name: t.data for name, t in exchanged.items()}  # views of the buckets now
        self.params = list(self.tensors.values())
        # With fragments, the buckets cut where each F-th of the model's bytes ends: equal fragments
        pieces = fragment_pieces(self.buckets.nbytes(), [f.element_size() for f in self.buckets.flats],
                                 self.options.fragments)
        Fragments([(hi - lo) * self.buckets.flats[b].element_size() for b, lo, hi in pieces],
                  self.options.fragments)  # a model of fewer elements than F: refused before any engine starts
        layers, layer_ranges = layers_on_pieces(describe_layers(model, buffers), self.buckets.ranges(), pieces)
        # Overlapped rounds work on a copy of the model, so local steps go on meanwhile.
        self.staging = HostStaging(self.buckets, self.options.staging, separate=self.options.overlap, pieces=pieces)
        self._arrays = self.staging.arrays  # what rounds read and merge, on the host
        own = self._make_channel() if engine is None else None  # owned: closed by close()
        self._own_engine = own is not None
        self.channel: DataChannel = own or engine
        self.runtime.register(self.channel.address)
        if self.runtime.client.donor is None:  # a joiner does not wait for the original job size
            self.runtime.client.wait_members(self.runtime.world_size, 60.0, receiving=True)
        self.reach: MulticastReach | None = None  # owned; auto mode with its own engine only
        if self.options.transport_mode == "auto" and own is not None:  # every engine is up: registered
            self.reach = MulticastReach(own, self.runtime.client, self.runtime.rank)
            self.runtime.client.on_event(self.reach.on_event)
            self.reach.probe({r: m.engine for r, m in self.runtime.client.members.items()})
        cls = SYNCHRONIZERS[self.options.sync]
        extra = {"staleness": self.options.staleness} if self.options.sync == "ssp" else {}
        self.sync: Synchronizer = cls(self._arrays, layers, self.channel,
                                      self.runtime.client, selection=self.options.selection,
                                      fanout=self.options.fanout, seed=seed, tolerance=policy_from_options(self.options),
                                      value_filter=make_filter("value", granularity=self.options.filter_granularity,
                                                                   init_scale=self.options.filter_init_scale,
                                                                   period=self.options.filter_period)
                                      if self.options.filter == "value" else None,
                                      outer=OuterOptimizer(self.options.outer_lr, self.options.outer_momentum),
                                      compress=self.options.compress, keep_nonfinite=self.options.keep_nonfinite,
                                      start_clock=self.runtime.client.start_clock,
                                      policy_options={"max_fanout": self.options.max_fanout or None,
                                                      "max_fanin": self.options.max_fanin or None,
                                                      "mixing_slack": self.options.mixing_slack}
                                      if self.options.selection == "selmcast" else None,
                                      transport_mode=self.options.transport_mode,
                                      layer_ranges=layer_ranges, fragments=self.options.fragments,
                                      slow_close=self.options.slow_close, **extra)
        self._donations: list[int] = []
        # Each rank's last engine address, and the ranks last heard of as dead: a final average
        # sends to a root that left the job (it is averaging), never to one known dead.
        self._engines = {r: m.engine for r, m in self.runtime.client.members.items() if m.engine}
        self._dead: set[int] = set()
        self.averaged_from: list[int] = []  # the ranks whose models `average_model` averaged here
        self.sync.inbox.states_kept = max(MAX_STATES, self.runtime.world_size)
        self._needs_state = False
        self._expelled = False
        self._closed = False
        self.resumed_step: int | None = None  # the checkpoint step `p2plearn.checkpoint.load` resumed from
        self._lock = threading.Lock()
        self.runtime.client.on_event(self._on_event)
        self._stats = TrainingStats()
        self.last_round: RoundStats | None = None
        # local steps per round: each of the F fragments is averaged once every period
        self.round_steps = self.options.period // self.options.fragments
        self.steps = self.runtime.client.start_clock * self.round_steps  # local steps taken (a joiner's: the donor's)
        # --overlap: a round lands overlap_steps local steps after it starts (at the latest, as the next starts)
        self.overlap_steps = self.round_steps if self.options.overlap_steps is None else self.options.overlap_steps
        self._round: threading.Thread | None = None  # the overlapped round in flight
        self._round_start = 0  # the local step it started at
        self._round_arrays: list[int] = []  # the arrays it carries (its fragment)
        self._round_outcome: RoundStats | BaseException | None = None
        self._snapshot: dict[int, np.ndarray] = {}  # what it started from, by array (add-the-change mixing only)
        self._last_step_end = time.monotonic()
        self.joined = self.runtime.client.donor is not None  # took a running job's state, not its own start
        if self.joined:
            with self._unless_job_ended():
                self._receive_state()

    # param_groups, state and defaults are the wrapped optimizer's (its load_state_dict replaces them)
    param_groups = property(lambda self: self.optimizer.param_groups,
                            lambda self, groups: setattr(self.optimizer, "param_groups", groups))
    state = property(lambda self: self.optimizer.state, lambda self, state: setattr(self.optimizer, "state", state))
    defaults = property(lambda self: self.optimizer.defaults,
                        lambda self, defaults: setattr(self.optimizer, "defaults", defaults))

    def _make_channel(self) -> Channel:
        host = self.runtime.engine_host()
        kwargs: dict[str, Any] = {}
        if self.options.emulate:
            if not self.options.topology:
                raise ValueError("--emulate needs --topology")
            kwargs["uplink_rate"], kwargs["drop_prob"] = _emulated_link(self.options, self.runtime.rank)
            kwargs["seed"] = self.runtime.rank + 1
            kwargs["max_datagram"] = 1472  # the emulated links are Ethernet: 1500-byte MTU, not loopback's 64 KiB
        if self.options.transport_mode != "unicast":
            kwargs.update(transport_mode=self.options.transport_mode, mcast_port=self.options.mcast_port,
                          mcast_groups=self.options.mcast_groups, mcast_ttl=self.options.mcast_ttl)
        # What a key holder can make this peer allocate, bounded by what the job sends: its largest
        # message (the model; with the value filter every tensor as float32, plus its header and an
        # index array per layer), and a few of them from every member at once (rounds in flight, or
        # the root of the final average, which takes one from each).
        widest = [np.broadcast_to(np.float32(0), (p.numel(),)) for p in self.params]  # per layer: filtered or cut by bounds
        largest = max(message_bytes(self._arrays), message_bytes(self.staging.bucket_arrays),
                      message_bytes(widest)) + 64 * (2 * len(widest) + 1) + 4096
        # Delivered messages wait for the next drain (between rounds, while steps compute): from every
        # member, its rounds up to the staleness bound ahead of this peer's, a state and a final model.
        members, claim = max(self.runtime.world_size, 2), largest + CHUNK_CLAIM
        secret, job = self.runtime.secret, self.runtime.job_id
        return Channel(host=host, sender_id=self.runtime.rank, job_id=job,
                       key=data_key(secret.value, job) if secret else None, max_message_bytes=largest,
                       max_partial_bytes=3 * members * claim,
                       max_queued_bytes=(self.options.staleness + 3) * members * claim, **kwargs)

    def step(self, closure: Any = None, loss: torch.Tensor | float | None = None) -> Any:
        """A local step of the wrapped optimizer and, every `round_steps` steps, a communication round;
        returns what the closure returned (None without one), as torch optimizers do. `loss` (or
        else the closure's) feeds the phase-aware tolerance. The last round's figures are in
        `last_round`. Raises `JobEnded` once the job ended without this peer."""
        with self._unless_job_ended():
            return self._step(closure, loss)

    def _step(self, closure: Any, loss: torch.Tensor | float | None) -> Any:
        if self._expelled:
            raise RuntimeError(f"rank {self.runtime.rank} was declared dead by the job and could not register "
                               f"again (its rank was taken, or no coordinator answered): stopping rather than "
                               f"training alone")
        if self._needs_state:
            self._finish_round(apply=False)  # its merge is of a model about to be replaced
            self._rejoin()
        result = self._local_step(closure)
        self.steps += 1
        waited = 0.0
        if self._round is not None and self.steps - self._round_start >= self.overlap_steps:
            waited = self._finish_round()
        if self.steps % self.round_steps == 0:
            if loss is None:
                loss = result
            value = float(loss.detach()) if isinstance(loss, torch.Tensor) else loss
            self._serve_donations()
            if self.options.overlap:
                self._start_round(value)
                if self.overlap_steps == 0:
                    waited += self._finish_round()
            else:
                self.staging.to_host()
                self.staging.wait_host()
                rs = self.sync.step(loss=value)
                self.staging.to_device()
                waited = rs.comm_s
                self._record(rs)
        now = time.monotonic()
        self._stats.compute_s += now - self._last_step_end - waited
        self._stats.comm_s += waited
        self._last_step_end = now
        return result

    def _record(self, rs: RoundStats) -> None:
        st = self._stats
        st.rounds += 1
        st.bytes_sent += rs.bytes_sent
        st.retransmitted += rs.retransmitted
        n = st.rounds
        st.average_p += (rs.fanout - st.average_p) / n
        st.receivers_per_round += (len(rs.receivers) - st.receivers_per_round) / n
        st.merged_per_round += (rs.merged - st.merged_per_round) / n
        st.merges += rs.merged
        st.mixed_with.update(rs.merged_from)
        st.delivered += (rs.delivered - st.delivered) / n
        st.round_times.append(rs.comm_s)
        st.send_times.append(rs.send_s)
        self.last_round = rs

    # -- overlapped rounds: one in flight on the host arrays, mixed into the model when it lands --

    def _start_round(self, loss: float | None) -> None:
        self.staging.to_host()
        self._round_start, self._round_arrays = self.steps, self.sync.fragments.arrays(self.sync.clock)

        def run() -> None:
            try:
                self.staging.wait_host()  # this thread waits for the copy; the training thread goes on
                if self.options.overlap_alpha is None:
                    self._snapshot = self.staging.snapshot(self._round_arrays)
                self._round_outcome = self.sync.step(loss=loss)
            except BaseException as exc:  # noqa: BLE001 - raised again in the training thread
                self._round_outcome = exc

        self._round = threading.Thread(target=run, name=f"p2plearn-round-{self.sync.clock}", daemon=True)
        self._round.start()

    def _finish_round(self, apply: bool = True) -> float:
        """Wait for the round in flight (if any) and mix its result into the model, which has taken
        local steps since it started (``overlap_alpha``: none adds the round's change, keeping
        them; alpha moves the model alpha of the way to the result); returns the seconds waited."""
        if self._round is None:
            return 0.0
        t0 = time.monotonic()
        self._round.join()
        waited = time.monotonic() - t0
        self._round, outcome, self._round_outcome = None, self._round_outcome, None
        if isinstance(outcome, BaseException):
            raise outcome
        if apply and self.options.overlap_alpha is None:
            self.staging.add_change(self._snapshot)
        elif apply:
            self.staging.mix(self._round_arrays, self.options.overlap_alpha)
        self._snapshot = {}
        self._record(outcome)
        return waited

    def flush(self) -> None:
        """Finish the overlapped round in flight and apply it (a no-op without --overlap);
        `state_dict`, `average_model` and `close` call it."""
        waited = self._finish_round()
        self._stats.comm_s += waited
        self._last_step_end += waited  # not the next step's compute

    def _local_step(self, closure: Any) -> Any:
        """The wrapped optimizer's step; under GradScaler, unscaled first, or skipped on inf/NaN."""
        found_inf = getattr(self, "found_inf", None)
        if found_inf is not None and float(found_inf) > 0:
            return None
        scale = getattr(self, "grad_scale", None)
        if scale is not None:
            grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
            torch._foreach_mul_(grads, 1.0 / float(scale))
        self.staging.before_step()
        return self.optimizer.step(closure) if closure is not None else self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict plus this peer's round state under "p2plearn" (local
        steps, round clock, the model as last merged, the outer update's momentum, the tolerance
        policy's and value filter's state, the history they read): what `load_state_dict` needs to
        go on exactly where this left off. An overlapped round in flight is finished and applied
        first. Tensors and plain values only, so ``torch.load(weights_only=True)`` reads it."""
        self.flush()
        state = self.optimizer.state_dict()
        state["p2plearn"] = _to_torch({**self.sync.state_dict(), "steps": self.steps})
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore `state_dict()`'s output. A peer that `joined` a running job keeps the round
        clock it took with the others' model and loads only the wrapped optimizer's state."""
        state = dict(state_dict)
        own = state.pop("p2plearn", None)
        self.optimizer.load_state_dict(state)
        if own is not None and not self.joined:
            own = _to_numpy(own)
            self.steps = int(own.get("steps", own["clock"] * self.round_steps))
            self.sync.load_state_dict(own)

    def report_accuracy(self, accuracy: float) -> None:
        """An evaluation accuracy in [0, 1] (e.g. per epoch), for phase-aware tolerance."""
        self.sync.training.accuracies.append(float(accuracy))

    def stats(self) -> TrainingStats:
        self._stats.bytes_received = self.channel.stats().get("bytes_received", 0)
        self._stats.coordinator_changes = self.runtime.client.coordinator_changes
        self._stats.nonfinite = sum(self.sync.nonfinite.values())
        return self._stats

    # -- joining peers: the state travels through the engine, the control plane only introduces ---

    def _on_event(self, event: Any) -> None:
        if event.kind in ("join", "update") and event.engine:
            self._engines[event.rank] = event.engine
            self._dead.discard(event.rank)
        elif event.kind == "dead":
            self._dead.add(event.rank)
        if event.kind == "donate":
            with self._lock:
                self._donations.append(int(event.rank))
        elif event.kind in ("readmitted", "expelled"):
            # Taken for dead while paused or stalled: this model is stale. Stop the round in flight;
            # the next step takes the donor's state (or stops, if the peer could not come back).
            self._needs_state = event.kind == "readmitted"
            self._expelled = event.kind == "expelled"
            self.sync.interrupt()

    def _serve_donations(self) -> None:
        """Send the model to joiners; one whose engine is not registered yet waits for next step."""
        members = self.runtime.client.members
        with self._lock:
            ready = {r: members[r].engine for r in self._donations if r in members and members[r].engine}
            self._donations = [r for r in self._donations if r not in ready and r in members]
        for rank, engine in ready.items():  # a copy: training goes on while it travels
            snapshot = self.staging.model_copy()
            self.channel.send(STATE_FLAG | self.sync.clock, snapshot,
                              [self._paced(rank, engine, {self.runtime.rank: [rank]})])

    def _paced(self, receiver: int, engine: tuple[str, int],
               transfers: dict[int, list[int]]) -> tuple[str, int, float]:
        """`receiver`'s `engine` with this peer's pacing rate among `transfers` (sender -> receivers,
        all at once), from the view's bandwidths as a round's plan is paced: unpaced, a whole model
        overruns any link slower than this host's NIC and arrives only after many passes."""
        host, port = engine
        view = self.runtime.client.view
        if view is None or max(receiver, *transfers) >= view.size:
            return host, port, 0.0
        sources, destinations, rates = plan_flows(NetworkView.from_global(view, 1.0), transfers)
        mine = [rate for i, j, rate in zip(sources, destinations, rates) if i == self.runtime.rank and j == receiver]
        return host, port, float(mine[0]) if mine else 0.0

    def _rejoin(self) -> None:
        self._needs_state = False
        self._stats.rejoins += 1
        client = self.runtime.client
        if client.donor is not None:
            self._receive_state()
        elif self.runtime.world_size > 1 and set(client.members) <= {self.runtime.rank}:
            # Readmitted while the job ends: every other peer left, nobody is left to train with.
            raise self._job_ended()

    def _receive_state(self, timeout: float = 60.0) -> None:
        """Take the model state from the donor. Ask for another donation every ASK_AGAIN_S (a donor
        may die, or send before it learned this peer's engine), and at once when the donor is no
        longer a member, until ``timeout``; `JobEnded` as soon as the job ended or no donor is left."""
        client = self.runtime.client
        deadline = time.monotonic() + timeout
        donor, asked = client.donor, time.monotonic()
        while True:
            d = self.sync.inbox.take_state(donor.rank, min(deadline, time.monotonic() + STATE_POLL_S))
            if d is not None and d.msg_id != FINAL_ID and d.complete and self._fits(d.arrays):
                break
            now = time.monotonic()
            if client.ended:
                raise self._job_ended()
            if now >= deadline:
                raise RuntimeError(f"rank {self.runtime.rank}: no model state from donor rank {donor.rank} within "
                                   f"{timeout:g} s; it cannot take part with a stale model")
            if donor.rank in client.members and now < asked + ASK_AGAIN_S:
                continue
            asked = now
            try:
                donor = client.ask_for_state()
            except ControlError:
                continue  # no coordinator answered just now (or the job ended: seen next): ask again later
            if donor is None:  # every other peer left: the job is ending without this one
                raise self._job_ended()
        for own, a in zip(self.staging.bucket_arrays, d.arrays):
            np.copyto(own, a.reshape(own.shape))  # the bits as sent: bfloat16 stays bfloat16
        self.staging.to_device()
        self.sync.adopt(d.msg_id & ~STATE_FLAG)
        # The donor sent this just before its round `clock`, at its step (clock + 1) * round_steps:
        # the next local step here is that round's, as it is the others'.
        self.steps = (self.sync.clock + 1) * self.round_steps - 1

    @contextmanager
    def _unless_job_ended(self) -> Iterator[None]:
        """`JobEnded` for the control plane's error once the coordinator said that the job ended."""
        try:
            yield
        except ControlError:
            if self.runtime.client.ended:
                raise self._job_ended() from None
            raise

    def _job_ended(self) -> JobEnded:
        return JobEnded(f"p2plearn rank {self.runtime.rank}: the job ended before this peer finished (it was "
                        f"stopped or stalled while the others trained to the end and left): stopping at step "
                        f"{self.steps}")

    def average_model(self, root: int = 0, timeout: float = 60.0) -> dict[str, torch.Tensor] | None:
        """Average the peers' models at one of them, after training; call it on every peer once it
        stops stepping. Returns, on the peer that averaged (the root), the average of every model it
        received (exactly) and its own, by state-dict name, for ``model.load_state_dict(averaged,
        strict=False)``, with ``averaged_from`` the ranks it holds; None on the others.

        The root is `root` if it is alive, else the next live rank (in rank order, from `root` on):
        each peer sends its model to the first of them whose engine takes it (one dead costs the
        engine's 3 s of silence, none once its death is known) and leaves the job; the first that
        reaches itself leaves the job and takes the models until no member is left that could send
        one (a member is still training, or sending), or for at most `timeout` s (it then names the
        ranks missing and averages what came). Leaving matters: peers still training (a late one:
        paused and readmitted, its clock ahead of the others') neither wait for a finished peer's
        rounds nor are held back by its clock, so the root never waits on a peer waiting for it."""
        self.flush()
        until = time.monotonic() + timeout
        client = self.runtime.client
        engines = {**self._engines, **{r: m.engine for r, m in client.members.items() if m.engine}}
        for candidate in sorted({*engines, self.runtime.rank}, key=lambda r: (r < root, r)):
            if candidate == self.runtime.rank:
                self._leave()
                return self._gather(until)
            if candidate in self._dead and candidate not in client.members:
                continue
            if self._send_final(candidate, engines[candidate], until):
                self._leave()
                return None
        self._leave()  # no peer took it (all gone): this peer's model is the average
        return self._gather(until)

    def _send_final(self, receiver: int, engine: tuple[str, int], until: float) -> bool:
        """Send this peer's model to `receiver`; whether its engine took it all."""
        members = self.runtime.client.members
        gather = {r: [receiver] for r in {*members, self.runtime.rank} if r != receiver}
        handle = self.channel.send(FINAL_ID, self.staging.model_copy(), [self._paced(receiver, engine, gather)])
        try:
            (sent,) = handle.wait(max(0.0, until - time.monotonic()))
        except TimeoutError:
            return False
        return sent.result in ("exact", "duplicate")  # duplicate: it had this message already

    def _leave(self) -> None:
        """Leave the job's membership: no peer plans with this one, waits for it or on its clock."""
        try:
            self.runtime.client.leave()
        except ControlError:
            pass  # no coordinator answered: the others find this peer gone by its silence

    def _gather(self, until: float) -> dict[str, torch.Tensor]:
        """The root's part: the final models of every member still in the job (and those already
        sent), averaged with this peer's own in rank order (the same sum whatever the arrival order)."""
        client, inbox = self.runtime.client, self.sync.inbox
        models: dict[int, list[np.ndarray]] = {}
        while True:
            # Members are peers still training or sending; one that left has sent its model (to the
            # first live candidate): it is in the engine's queue by now, or went to another root.
            missing = set(client.members) - set(models) - {self.runtime.rank}
            inbox.drain()
            d = inbox.take_state(None, 0.0)
            if d is None:
                if not missing:
                    break
                if time.monotonic() >= until:
                    log.warning("p2plearn rank %d: rank(s) %s sent no model within the final average's timeout; "
                                "averaging the %d that came", self.runtime.rank, sorted(missing), len(models) + 1)
                    break
                d = inbox.take_state(None, min(until, time.monotonic() + 0.1))
            if d is not None and d.msg_id == FINAL_ID and d.complete and self._fits(d.arrays):
                models[d.sender] = d.arrays
        self.averaged_from = sorted({*models, self.runtime.rank})
        total = [torch.from_numpy(values(a)).double() for a in self.staging.model_copy()]
        for rank in sorted(models):
            for t, a, f in zip(total, models[rank], self.buckets.flats):
                t += torch.from_numpy(bf16_values(a) if f.dtype == torch.bfloat16 else a)
        n = len(models) + 1
        return {name: (total[s.bucket][s.start:s.end] / n).to(p.dtype).reshape(p.shape)
                for name, s, p in zip(self.tensors, self.buckets.slots, self.params)}

    def _fits(self, arrays: list[np.ndarray] | None) -> bool:
        """Whether a model state received (per bucket) matches this model's (a key holder could send any)."""
        own_arrays = self.staging.bucket_arrays
        return arrays is not None and len(arrays) == len(own_arrays) and all(
            a.dtype == own.dtype and a.size == own.size for a, own in zip(arrays, own_arrays))

    def close(self) -> None:
        """Finish the round in flight, leave the job, print this peer's one-line summary, and
        release the engine (also when the round in flight failed: its error is raised after).
        Call it once this peer stops stepping (before a long evaluation, say): while it stays a
        member, the others run at most 16 rounds (SSP: the staleness) ahead of its clock. A second
        call does nothing (a `finally:` after an earlier close, say)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        finally:
            if self.runtime.rank == 0 and self.resumed_step == self.steps:
                print(f"p2plearn: nothing left to train: the checkpoint at step {self.steps} is the end", flush=True)
            print(f"p2plearn rank {self.runtime.rank}: {self.stats().summary()}", flush=True)
            if self.reach is not None:
                self.reach.close()
            self.runtime.close()
            if self._own_engine:
                self.channel.close()
