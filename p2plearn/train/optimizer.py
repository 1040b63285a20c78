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

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.optim import Optimizer

from p2plearn import checkpoint
from p2plearn.control import ControlError
from p2plearn.protocols import DataChannel
from p2plearn.runtime import Runtime, init
from p2plearn.sync import RoundStats, Synchronizer
from p2plearn.train.advice import closing_hint
from p2plearn.train.channel import make_channel
from p2plearn.train.final_average import FinalAverage
from p2plearn.train.layout import ModelLayout, describe_layers, exchanged_tensors, layers_on_pieces
from p2plearn.train.overlap import OverlappedRound
from p2plearn.train.reach import MulticastReach
from p2plearn.train.staging import HostStaging
from p2plearn.train.state_transfer import FINAL_ID, JobEnded, StateTransfer
from p2plearn.train.stats import TrainingStats
from p2plearn.train.synchronizer import make_synchronizer

# Importable from here, as they always were: the optimizer's parts now live one per file.
__all__ = ["DecentralizedOptimizer", "FINAL_ID", "JobEnded", "TrainingStats", "describe_layers", "exchanged_tensors",
           "layers_on_pieces"]


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


def _round_log(log_dir: str | None, rank: int) -> Any:
    """``--log-dir``'s writer of this rank's rounds (``p2plearn.monitor.round_log``), imported only when asked for."""
    if not log_dir:
        return None
    from p2plearn.monitor.round_log import RoundLog

    return RoundLog(log_dir, rank)


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
    would give it new tensors outside the buckets (the next step refuses it). A model on CUDA (or any torch device) is
    averaged through host buffers (see `p2plearn.train.staging`); ``staging="host"`` makes a CPU
    model take the same path.

    Args:
        optimizer: any torch optimizer over `model`'s parameters (tensors on any device, of any
            float dtype: float32, float16, bfloat16, float64; they travel in their own dtype and
            are merged in float64).
        model: the model whose trainable parameters (and floating buffers) are exchanged; a
            parameter frozen now (``requires_grad`` False) is not, and may not be unfrozen later.
        runtime: from `p2plearn.init()`; made here when not given.
        engine: a channel to use instead of creating one (a `Channel`, or the TCP baseline's
            `TcpChannel`); the caller closes it.
        buffers: also average floating buffers (BatchNorm's running statistics) with the
            parameters; False keeps them local to each peer.
        seed: tie-break seed of the selection policy; the same on every peer.
        overrides: option values over the runtime's (sync, staleness, selection, fanout, robust,
            loss_bound, tolerance, deadline_ms, log_dir, ...): see `p2plearn.options.Options`.

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
        self.layout = ModelLayout(model, buffers, max(1, int(self.options.bucket_mb * 2**20)), self.options.fragments)
        self._frozen = [p for p in model.parameters() if not p.requires_grad]  # not exchanged (`exchanged_tensors`)
        self.buckets, self.tensors, self.params = self.layout.buckets, self.layout.tensors, self.layout.params
        # Overlapped rounds work on a copy of the model, so local steps go on meanwhile.
        self.staging = HostStaging(self.buckets, self.options.staging, separate=self.options.overlap,
                                   pieces=self.layout.pieces)
        own = make_channel(self.runtime, self.options, self.staging.arrays, self.staging.bucket_arrays,
                           self.params) if engine is None else None  # owned: closed by close()
        self._own_engine = own is not None
        self.channel: DataChannel = own or engine
        client, rank = self.runtime.client, self.runtime.rank
        self.runtime.register(self.channel.address)
        if client.donor is None:  # a joiner does not wait for the original job size
            client.wait_members(self.runtime.world_size, 60.0, receiving=True)
        self.reach: MulticastReach | None = None  # owned; auto mode with its own engine only
        if self.options.transport_mode == "auto" and own is not None:  # every engine is up: registered
            self.reach = MulticastReach(own, client, rank)
            client.on_event(self.reach.on_event)
            self.reach.probe({r: m.engine for r, m in client.members.items()})
        # The parts, each in its own file: the round core, the final average, joins, overlapped rounds.
        self.sync: Synchronizer = make_synchronizer(self.options, self.layout, self.staging.arrays, self.channel,
                                                    client, seed)
        self.final_average = FinalAverage(rank, self.runtime.world_size, client, self.channel, self.sync,
                                          self.staging, self.layout)
        self.state_transfer = StateTransfer(rank, client, self.channel, self.sync, self.staging, self._job_ended)
        self._closed = False
        self.resumed_step: int | None = None  # the checkpoint step `p2plearn.checkpoint.load` resumed from
        client.on_event(self.final_average.on_event)
        client.on_event(self.state_transfer.on_event)
        self._stats = TrainingStats()
        self._cpu_at_start = time.process_time()
        self.last_round: RoundStats | None = None
        self.round_log = _round_log(self.options.log_dir, rank)  # --log-dir: owned, closed by close()
        self._round_loss: float | None = None  # the loss the latest round started with (for the log)
        # local steps per round: each of the F fragments is averaged once every period
        self.round_steps = self.options.period // self.options.fragments
        self.steps = client.start_clock * self.round_steps  # local steps taken (a joiner's: the donor's)
        # --overlap: a round lands overlap_steps local steps after it starts (at the latest, as the next starts)
        self.overlap_steps = self.round_steps if self.options.overlap_steps is None else self.options.overlap_steps
        self.overlapped = OverlappedRound(self.sync, self.staging, self.overlap_steps, self.options.overlap_alpha)
        self._last_step_end = time.monotonic()
        self.joined = client.donor is not None  # took a running job's state, not its own start
        if self.joined:
            with self._unless_job_ended():
                self._receive_state()

    # param_groups, state and defaults are the wrapped optimizer's (its load_state_dict replaces them)
    param_groups = property(lambda self: self.optimizer.param_groups,
                            lambda self, groups: setattr(self.optimizer, "param_groups", groups))
    state = property(lambda self: self.optimizer.state, lambda self, state: setattr(self.optimizer, "state", state))
    defaults = property(lambda self: self.optimizer.defaults,
                        lambda self, defaults: setattr(self.optimizer, "defaults", defaults))

    def step(self, closure: Any = None, loss: torch.Tensor | float | None = None) -> Any:
        """A local step of the wrapped optimizer and, every `round_steps` steps, a communication round;
        returns what the closure returned (None without one), as torch optimizers do. `loss` (or
        else the closure's) feeds the phase-aware tolerance. The last round's figures are in
        `last_round`. Raises `JobEnded` once the job ended without this peer."""
        with self._unless_job_ended():
            return self._step(closure, loss)

    def _step(self, closure: Any, loss: torch.Tensor | float | None) -> Any:
        if self.state_transfer.expelled:
            raise RuntimeError(f"rank {self.runtime.rank} was declared dead by the job and could not register "
                               f"again (its rank was taken, or no coordinator answered): stopping rather than "
                               f"training alone")
        if any(p.requires_grad for p in self._frozen):
            raise RuntimeError("a parameter that was frozen (requires_grad False) when this optimizer was made is "
                               "trainable now: the peers do not exchange it; make the optimizer again after "
                               "unfreezing")
        # before a step that starts a round (checked once a round: 12 us a check for a small MLP, 3% of its step)
        if (self.steps + 1) % self.round_steps == 0 and (moved := self.layout.moved()) is not None:
            raise RuntimeError(f"the model's {moved!r} is no longer the tensor this optimizer exchanges: the model "
                               f"was moved or its tensors replaced after the optimizer was made (model.to(...), "
                               f".double(), parameter.data = ..., load_state_dict(..., assign=True)), so the "
                               f"peers would not see its training; make the optimizer after moving the model "
                               f"(load_state_dict without assign copies values in place)")
        if self.state_transfer.needs_state:
            self._finish_round(apply=False)  # its merge is of a model about to be replaced
            self._rejoin()
        result = self._local_step(closure)
        self.steps += 1
        waited = 0.0
        if self.overlapped.due(self.steps):
            waited = self._finish_round()
        if self.steps % self.round_steps == 0:
            if loss is None:
                loss = result
            value = float(loss.detach()) if isinstance(loss, torch.Tensor) else loss
            self._round_loss = value
            self.state_transfer.serve()
            if self.options.overlap:
                self.overlapped.start(value, self.steps)
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
        self._stats.add_round(rs)
        self.last_round = rs
        if self.round_log is not None:
            self.round_log.add(rs, loss=self._round_loss, compute_total=self._stats.compute_s)

    def _finish_round(self, apply: bool = True) -> float:
        """Wait for the overlapped round in flight (if any), mix its result into the model unless
        not `apply`, and count it; returns the seconds waited."""
        waited, outcome = self.overlapped.finish(apply)
        if outcome is not None:
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
        self._stats.cpu_s = time.process_time() - self._cpu_at_start
        self._stats.coordinator_changes = self.runtime.client.coordinator_changes
        self._stats.nonfinite = sum(self.sync.nonfinite.values())
        self._stats.robust = self.sync.robust.stats() if self.sync.robust is not None else None
        return self._stats

    # -- joining peers: the state travels through the engine, the control plane only introduces ---

    def _rejoin(self) -> None:
        self.state_transfer.needs_state = False
        self._stats.rejoins += 1
        client = self.runtime.client
        if client.donor is not None:
            self._receive_state()
        elif self.runtime.world_size > 1 and set(client.members) <= {self.runtime.rank}:
            # Readmitted while the job ends: every other peer left, nobody is left to train with.
            raise self._job_ended()

    def _receive_state(self) -> None:
        self.state_transfer.receive()
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
        return self.final_average.average(root, timeout)

    @property
    def averaged_from(self) -> list[int]:
        """The ranks whose models `average_model` averaged here (empty on a peer that sent its own)."""
        return self.final_average.averaged_from

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
            checkpoint.closing(self)  # nothing left to train, said; a job's end marked at its last save
            print(f"p2plearn rank {self.runtime.rank}: {self.stats().summary()}", flush=True)
            hint = closing_hint(self.options, self._stats) if self.runtime.rank == 0 else None
            if hint:
                print(hint, flush=True)
            if self.round_log is not None:
                self.round_log.close()
            if self.reach is not None:
                self.reach.close()
            # the engine closes before the job hears this peer left: a peer that left may be a final
            # average's root, so a final model sent after the leave must not land in an engine closing here
            if self._own_engine:
                self.channel.close()
            self.runtime.close()
