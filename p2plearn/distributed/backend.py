"""The ``p2plearn`` torch.distributed backend: a ProcessGroup whose collectives run over the engine.

    import torch.distributed as dist
    dist.init_process_group("p2plearn")  # under torchrun, mpirun, srun or p2plearn-run

(torch registers the backend as it starts: `p2plearn.distributed.plugin`.)

Rendezvous is ``p2plearn.init()``'s (rank and size from the launcher's variables, or from
``init_process_group(rank=, world_size=)``; the coordinator at ``MASTER_PORT + 1``; the job's
secret keys the data plane's tags). Every collective is queued to one thread of the group, which
runs them in order (`Collectives`); each returns at once with a work object whose future
completes when it is done, so DDP's bucket all-reduces overlap its backward pass.

Every collective is lossless. Loss bounds apply only where `allreduce_tolerant` is called: the
DDP comm hook (`p2plearn.ddp.loss_tolerant_hook`) does so for gradient buckets.

Supported: allreduce and reduce (SUM, AVG, PRODUCT, MIN, MAX; BAND, BOR, BXOR on integers),
broadcast, allgather (and into one tensor), gather, scatter, reduce_scatter (and from one tensor),
alltoall (and of one tensor), barrier; the object collectives and torch.distributed.checkpoint are
built on these, and the coalesced variants on them. Point to point: send and recv from a given rank
(`PointToPoint`, over a second engine of the group's). Subgroups (``new_group``, ``new_subgroups``,
a DeviceMesh's) each run over engines of their own, in the world group's job. Other ops raise
NotImplementedError naming the op. Tensors may live on any device: a CUDA tensor's collective runs
on a pinned host copy, as gloo's does (`CollectiveStaging`).
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import json
import os
import queue
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from p2plearn.distributed.collectives import SEQS, Collectives
from p2plearn.distributed.pointtopoint import PointToPoint
from p2plearn.distributed.sender import CollectiveError, CollectiveTimeout, Links, Sender
from p2plearn.distributed.plugin import BACKEND
from p2plearn.distributed.staging import CollectiveStaging
from p2plearn.keys import data_key
from p2plearn.sync.bfloat16 import BF16Array
from p2plearn.control import ControlError
from p2plearn.runtime import Runtime, detect_rank, init
from p2plearn.tolerance import RoundRecord
from p2plearn.transport import ANSWER_LINGER_S, CHUNK_CLAIM, Channel

STOP_S = 2.0  # at exit: how long the group's thread may take to see its collective fail, and leaving the job
IDLE_S = 0.2  # at exit: how long the group's thread may take to end when no collective is in flight
DEFAULT_RATE = 1.25e8  # bytes/s of a link the view has no figure for (the bandwidth estimator's default)
_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.PRODUCT: "product",
        dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max", dist.ReduceOp.BAND: "band", dist.ReduceOp.BOR: "bor",
        dist.ReduceOp.BXOR: "bxor"}
BITWISE = ("band", "bor", "bxor")


class ProcessGroupP2P(dist.ProcessGroup):
    """A process group over engines of its own, one for collectives and one for point-to-point
    operations (see the module's docstring): the world's, or a subgroup's (``new_group``), which
    shares the world's membership and failure.

    Built by ``init_process_group("p2plearn")`` and ``new_group``; use it through
    torch.distributed. Tuning: the group's ``timeout`` (``init_process_group(timeout=...)``,
    ``new_group(timeout=...)``) is how long a lossless collective waits for a rank before it
    fails, naming the rank.
    """

    def __init__(self, runtime: Runtime, channel: Channel, engines: dict[int, tuple[str, int]],
                 p2p_channel: Channel, p2p_engines: dict[int, tuple[str, int]], links: Links, timeout: timedelta,
                 max_message_bytes: int | None = None, kept_bytes: int = 1 << 30,
                 world: ProcessGroupP2P | None = None, ranks: Sequence[int] | None = None) -> None:
        self.ranks = list(range(runtime.world_size) if ranks is None else ranks)  # group rank -> global rank
        super().__init__(self.ranks.index(runtime.rank), len(self.ranks))
        self.runtime = runtime
        self.channel = channel  # collectives' engine, owned: closed by the world group's close, after its linger
        self.p2p_channel = p2p_channel  # point-to-point operations' engine, owned as channel
        self.world = self if world is None else world  # holds the failure and the subgroups
        self.subgroups: list[ProcessGroupP2P] = []  # (the world's) their channels close with its own
        self.links = links
        self._group_name = ""  # torch's name for it, set once made
        self.incarnation = 0  # (the world's) which world of this process it is: its subgroups' store prefix
        self.departed: dict[int, str] = {}  # group rank -> why it is no longer in the job (the membership's events)
        runtime.client.on_event(self._on_event)
        self.collectives = Collectives(channel, self.rank(), self.size(), engines, links, timeout.total_seconds(),
                                       self.departed, max_message_bytes, kept_bytes)
        self.point_to_point = PointToPoint(Sender(p2p_channel, self.rank(), self.size(), p2p_engines, links,
                                                  timeout.total_seconds(), self.departed, max_message_bytes),
                                           timeout.total_seconds())
        self._seq = 0
        self._failure: BaseException | None = None  # (the world's) the first collective that failed in any group
        self._lock = threading.Lock()  # collectives come from the main thread and from autograd's
        self._stage_cpu = runtime.options.staging == "host"
        self._side: torch.cuda.Stream | None = None  # CUDA copies' stream, made at the first CUDA tensor
        self._queue: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="p2plearn-collectives", daemon=True)
        self._worker.start()
        if world is None:
            atexit.register(self._stop_at_exit)
        else:
            world.subgroups.append(self)

    def _on_event(self, event: Any) -> None:
        """A rank that leaves or is declared dead fails the collectives waiting for it (and every
        later one: a DDP group has no rejoin), as a closed connection does gloo's."""
        if event.kind in ("dead", "leave") and event.rank in self.ranks:
            why = ("was declared dead by the job (its process exited, or stopped answering the coordinator)"
                   if event.kind == "dead" else
                   "left the job (one of its collectives failed, or it destroyed its process group)")
            if self.world is not self:
                why = f"(global rank {event.rank}) {why}"
            self.departed.setdefault(self.ranks.index(event.rank), why)
        elif event.kind in ("expelled", "readmitted"):
            self.departed.setdefault(self.rank(), "(this rank) was declared dead by the job while it paused or stalled")
        elif event.kind in ("job_ended", "coordinator_dead"):
            why = "ended" if event.kind == "job_ended" else "lost its coordinator"
            for r in range(self.size()):
                self.departed.setdefault(r, f"is gone: the job {why}")

    def stats(self) -> dict[str, Any]:
        """What the group refused and dropped: messages refused by reason (a member's forgery or a
        rank's bug: other shapes, outside the window of collectives ahead, over its quotas),
        messages of collectives already over, and the engine's counters; the same of its
        point-to-point operations (messages no receive asked for, ...)."""
        return {"refused": dict(self.collectives.mailbox.refused), "late": self.collectives.mailbox.late,
                "engine": self.channel.stats(),
                "point_to_point": {"refused": dict(self.point_to_point.refused),
                                   "failed_after_end": self.point_to_point.failed_after_end,
                                   "engine": self.p2p_channel.stats()}}

    # -- the queue -----------------------------------------------------------------------------
    def _staging(self, *tensors: torch.Tensor) -> CollectiveStaging:
        """A collective's staging, on the caller's thread (its copies follow the caller's stream)."""
        with self._lock:
            cuda = next((t for t in tensors if t.is_cuda), None)
            if cuda is not None and self._side is None:
                self._side = torch.cuda.Stream(device=cuda.device)
            return CollectiveStaging(self._stage_cpu, self._side)

    def _submit(self, run: Callable[[int], Any], result: Any, staging: CollectiveStaging) -> dist.Work:
        """Queue ``run(seq)`` on ``staging``'s host tensors; the work's future gets ``result`` (or
        run's return value when ``result`` is None) once the outputs are back, or run's error."""
        future: torch.futures.Future = torch.futures.Future()
        with self._lock:
            seq, self._seq = self._seq, (self._seq + 1) % SEQS
            self._queue.put((seq, run, result, future, staging))
        return _Work(future)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            seq, run, result, future, staging = item
            try:
                self._check_failed(f"collective #{seq}")
                staging.wait_inputs()
                value = run(seq)
                staging.write_back()
                future.set_result(value if result is None else result)
            except BaseException as exc:  # the caller's wait() raises it
                self._fail(exc)
                future.set_exception(exc)

    def _check_failed(self, what: str) -> None:
        if (failure := self.world._failure) is not None:
            raise CollectiveError(f"p2plearn: {what} not run: a collective of this rank failed before ({failure}); "
                                  f"destroy the group and start again") from failure

    def _fail(self, exc: BaseException) -> None:
        """The first failure of an operation in any group of this rank: the ranks may now disagree on
        what ran, so no later operation runs in any group of it, and leaving the job fails the others'
        naming this rank, as a closed connection does gloo's."""
        if self.world._failure is None:
            self.world._failure = exc
            self._leave()

    def _leave(self) -> None:
        try:
            self.runtime.client.leave(timeout=STOP_S)  # (a coordinator that is gone would hold it for 5 s)
        except ControlError:
            pass  # no coordinator answered: the others learn it from this rank's exit

    def _groups(self) -> list[ProcessGroupP2P]:
        """The world's subgroups, then the world (a subgroup: itself)."""
        return [*self.subgroups, self] if self.world is self else [self]

    def shutdown(self) -> None:
        """Finish the queued collectives; the world's then leaves the job (``destroy_process_group``;
        see `_close`). A subgroup's engine goes on answering until the world's closes."""
        for group in self._groups():
            if group._worker.is_alive():
                group._queue.put(None)
                group._worker.join()
        if self.world is self:
            atexit.unregister(self._stop_at_exit)
            self._close(ANSWER_LINGER_S)

    def _stop_at_exit(self) -> None:
        """The interpreter exits with the world group alive (the script's end without
        ``destroy_process_group``, Ctrl-C, SIGTERM's exception, an error). Queued collectives are not
        run (gloo's are not either). A collective in flight in any group is failed by stopping the
        engines at once, so that no thread of a group holds the exit up and the other ranks'
        collectives fail now rather than once the membership declares this rank dead; with none in
        flight this rank leaves as ``shutdown`` does."""
        self._failure = self._failure or CollectiveError("p2plearn: the process is exiting")
        groups = self._groups()
        for group in groups:
            group._queue.put(None)
        for group in groups:
            group._worker.join(IDLE_S)  # an idle group's thread ends at once
        in_flight = any(group._worker.is_alive() for group in groups)
        if in_flight:
            for group in groups:
                group.channel.close()  # (point-to-point operations in flight end when its engine closes, below)
            for group in groups:
                group._worker.join(STOP_S)
        self._close(0.0 if in_flight else ANSWER_LINGER_S)

    def _close(self, linger: float) -> None:
        """(The world's) Leave the job, and stop the engines once the other ranks left too
        (``linger`` s at most). Until then the engines go on answering: a rank still in the last
        collective, whose acknowledgements from this one were lost, retransmits and hears back, as a
        closed TCP socket's data is still acknowledged by its kernel; an engine stopped at once would
        leave that send unanswered and fail the other rank's collective. Rank 0 then stops the
        coordinator."""
        global _world
        self._leave()
        if linger > 0:
            self.runtime.client.wait_alone(linger)
        for group in self._groups():
            group.channel.close()
            group.p2p_channel.close()
        self.runtime.close(leave=False, linger=0.0)
        if _world is self:
            _world = None

    def getBackendName(self) -> str:
        return BACKEND

    # c10d reads a group's name from its first backend, and this group registers none (it is its
    # own backend): it keeps the name torch gives it (DeviceMesh looks its groups up by name)
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    # -- collectives ---------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        tensor = _one(tensors, "allreduce")
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "allreduce", tensor)
        staging = self._staging(tensor)
        host = staging.update(tensor)
        return self._submit(lambda seq: _in_place(host, lambda a: self.collectives.allreduce(seq, [a], op)), tensors,
                            staging)

    def allreduce_tolerant(self, tensor: torch.Tensor, layers: Sequence[int], bounds: Sequence[float],
                           deadline: float | None) -> torch.futures.Future:
        """Average ``tensor`` (a flat contiguous float bucket) over the ranks, each layer
        (``layers``: its element counts, in order) within its loss bound and each phase within
        ``deadline`` s (None: none). The future's value is the RoundRecord the round measured."""
        staging = self._staging(tensor)
        host = staging.update(tensor)

        def run(seq: int) -> RoundRecord:
            def reduce(flat: np.ndarray) -> RoundRecord:
                views = np.split(flat, np.cumsum(layers)[:-1]) if len(layers) > 1 else [flat]
                return self.collectives.allreduce(seq, views, "avg", bounds, deadline)
            return _widened(host, reduce)

        return self._submit(run, None, staging).get_future()

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        """All-reduce's two phases, the reduced parts gathered to the root alone; the other ranks'
        tensors are left as they were (gloo's are scratch)."""
        tensor, root = _one(tensors, "reduce"), opts.rootRank
        op = _op(opts.reduceOp, "reduce", tensor)
        staging, is_root = self._staging(tensor), self.rank() == root
        host = staging.update(tensor) if is_root else staging.read(tensor)

        def run(seq: int) -> None:
            reduced = host if is_root else host.clone()  # (cloned once the staged copy is in)
            _in_place(reduced, lambda a: self.collectives.allreduce(seq, [a], op, root=root))

        return self._submit(run, tensors, staging)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        tensor, root = _one(tensors, "broadcast"), opts.rootRank
        staging = self._staging(tensor)
        host = staging.update(tensor)
        return self._submit(lambda seq: _in_place(host, lambda a: self.collectives.broadcast(seq, a, root)), tensors,
                            staging)

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
                  ) -> dist.Work:
        tensor, outputs = _one(inputs, "allgather"), _one(output_lists, "allgather")
        staging = self._staging(tensor, *outputs)
        source, targets = staging.read(tensor), [staging.write(o) for o in outputs]

        def run(seq: int) -> None:
            flat = [o.detach().contiguous() for o in targets]
            self.collectives.allgather(seq, _array(source.contiguous()), [_array(o) for o in flat])
            _copy_back(targets, flat)

        return self._submit(run, output_lists, staging)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        pieces = _equal_pieces(output, input, self.size(), "all_gather_into_tensor")
        staging = self._staging(output, input)
        source, target = staging.read(input), staging.write(output)
        return self._submit(lambda seq: self.collectives.allgather(
            seq, _array(source.contiguous()), _pieces(target, pieces)), output, staging)

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> dist.Work:
        tensor, root = _one(inputs, "gather"), opts.rootRank
        outputs = _one(output_lists, "gather") if self.rank() == root else []
        staging = self._staging(tensor, *outputs)
        source, targets = staging.read(tensor), [staging.write(o) for o in outputs]

        def run(seq: int) -> None:
            flat = [o.detach().contiguous() for o in targets]
            self.collectives.gather(seq, _array(source.contiguous()), [_array(o) for o in flat] or None, root)
            _copy_back(targets, flat)

        return self._submit(run, output_lists, staging)

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> dist.Work:
        tensor, root = _one(outputs, "scatter"), opts.rootRank
        inputs = _one(input_lists, "scatter") if self.rank() == root else []
        staging = self._staging(tensor, *inputs)
        target, sources = staging.write(tensor), [staging.read(i) for i in inputs]
        return self._submit(lambda seq: _in_place(target, lambda a: self.collectives.scatter(
            seq, [_array(i.contiguous()) for i in sources] or None, a, root)), outputs, staging)

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any
                       ) -> dist.Work:
        tensor, inputs = _one(outputs, "reduce_scatter"), _one(input_lists, "reduce_scatter")
        op = _op(opts.reduceOp, "reduce_scatter", tensor)
        staging = self._staging(tensor, *inputs)
        target, sources = staging.write(tensor), [staging.read(i) for i in inputs]
        return self._submit(lambda seq: _in_place(target, lambda a: self.collectives.reduce_scatter(
            seq, [_array(i.contiguous()) for i in sources], a, op)), outputs, staging)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> dist.Work:
        op = _op(opts.reduceOp, "reduce_scatter_tensor", output)
        pieces = _equal_pieces(input, output, self.size(), "reduce_scatter_tensor")
        staging = self._staging(output, input)
        target, source = staging.write(output), staging.read(input)
        return self._submit(lambda seq: _in_place(target, lambda a: self.collectives.reduce_scatter(
            seq, _pieces(source.contiguous(), pieces), a, op)), output, staging)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        staging = self._staging(*outputs, *inputs)
        targets, sources = [staging.write(o) for o in outputs], [staging.read(i) for i in inputs]

        def run(seq: int) -> None:
            flat = [o.detach().contiguous() for o in targets]
            self.collectives.all_to_all(seq, [_array(i.contiguous()) for i in sources], [_array(o) for o in flat])
            _copy_back(targets, flat)

        return self._submit(run, outputs, staging)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> dist.Work:
        """``all_to_all_single``: the tensors cut along their first dimension, in equal pieces
        unless split sizes are given."""
        sends, receives = (_split_sizes(t, sizes, self.size()) for t, sizes in ((input, input_split_sizes),
                                                                                  (output, output_split_sizes)))
        staging = self._staging(output, input)
        target, source = staging.write(output), staging.read(input)

        def run(seq: int) -> None:
            flat = target.detach().contiguous()
            self.collectives.all_to_all(seq, _pieces(source.contiguous(), sends), _pieces(flat, receives))
            _copy_back([target], [flat])

        return self._submit(run, output, staging)

    def barrier(self, opts: Any = None) -> dist.Work:
        return self._submit(lambda seq: self.collectives.barrier(seq), [], self._staging())

    # -- point to point -------------------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int = 0) -> dist.Work:  # noqa: N803 (c10d's names)
        tensor, peer = _one(tensors, "send"), self._peer(dstRank, "send")
        staging = self._staging(tensor)
        host = _array(staging.read(tensor))
        return self._point_to_point("send", lambda done: self.point_to_point.send(
            host, peer, tag, done, staging.wait_inputs), tensors, staging)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int = 0) -> dist.Work:  # noqa: N803
        tensor, peer = _one(tensors, "recv"), self._peer(srcRank, "recv")
        staging = self._staging(tensor)
        host = _array(staging.write(tensor))
        return self._point_to_point("recv", lambda done: self.point_to_point.recv(host, peer, tag, done), tensors,
                                    staging)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> dist.Work:
        """Not implemented: says so by name, instead of c10d's generic error."""
        raise NotImplementedError("the p2plearn backend does not implement recv_anysource")

    def _peer(self, rank: int, what: str) -> int:
        """A point-to-point operation's other rank, checked at the call (as torch's own checks raise)."""
        if not 0 <= rank < self.size() or rank == self.rank():
            raise ValueError(f"p2plearn: {what}: rank {rank} is not another rank of this group of {self.size()}")
        return rank

    def _point_to_point(self, what: str, start: Callable[[Callable[[BaseException | None], None]], None],
                        result: Any, staging: CollectiveStaging) -> dist.Work:
        """Start a point-to-point operation (it runs on a thread of its own, not the group's queue:
        only two ranks call it); its work completes once the outputs are back, or with its error,
        which fails this rank's groups as a collective's does."""
        future: torch.futures.Future = torch.futures.Future()

        def finished(error: BaseException | None) -> None:
            if error is None:
                try:
                    staging.write_back()
                except BaseException as exc:  # noqa: BLE001 - the work's error
                    error = exc
            if error is None:
                future.set_result(result)
            else:
                self._fail(error)
                future.set_exception(error)

        try:
            self._check_failed(what)
            start(finished)
        except BaseException as exc:  # noqa: BLE001 - the work's error, as a queued collective's
            finished(exc)
        return _Work(future)

    # -- coalesced: each tensor's collective queued in turn, one work for them all --------------
    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return _all_of([self.allreduce([t], opts) for t in tensors], tensors)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> dist.Work:
        return _all_of([self.allgather([o], [i], opts) for o, i in zip(output_lists, inputs, strict=True)],
                       output_lists)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        return _all_of([self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)], outputs)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        return _all_of([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)],
                       outputs)

    _allgather_base = all_gather_single  # the names older callers use
    _reduce_scatter_base = reduce_scatter_single
    all_to_all_single = alltoall_base  # (torch calls the group's CPU all-to-all by this name)
    all_gather_single_coalesced = allgather_into_tensor_coalesced  # (and these, functional collectives')
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced


class _Work(dist.Work):
    """A queued collective, as gloo's work: ``wait()`` (and the synchronous call) and the future
    raise the collective's error; ``wait(timeout)`` raises once ``timeout`` passes first; SIGINT
    interrupts ``wait()`` (KeyboardInterrupt)."""

    def __init__(self, future: torch.futures.Future) -> None:
        super().__init__()
        self._future = future
        # What C++ callers (DDP's reducer) get: set_exception stores the error as the future's value,
        # which only Python unwraps; read as a result, it crashed the reducer. A callback that raises
        # completes this one with the error itself.
        self._chained = future.then(lambda done: done.value())
        self._done = threading.Event()
        future.add_done_callback(lambda _: self._done.set())

    def wait(self, timeout: timedelta | None = None) -> bool:
        seconds = timeout.total_seconds() if timeout else 0.0
        # in Python, not in the future's C++ wait: Ctrl-C interrupts a synchronous collective or barrier
        if not self._done.wait(seconds if seconds > 0 else None):
            raise CollectiveTimeout(f"p2plearn: a collective did not complete within wait()'s {seconds:g} s")
        self._future.wait()  # raises the collective's error
        return True

    def get_future(self) -> torch.futures.Future:
        """The outputs; a failed collective's future completes with its error (a RuntimeError that
        carries the collective's message), as gloo's."""
        return self._chained

    def result(self) -> Any:
        """The collective's outputs, once done (its error raised)."""
        self.wait()
        return self._future.value()

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self) -> BaseException | None:
        if not self._future.done():
            return None
        try:
            self._future.value()
        except BaseException as exc:  # noqa: BLE001 - the collective's error, returned as c10d's Work does
            return exc
        return None


def _all_of(works: list[_Work], result: Any) -> _Work:
    """One work for several queued ones: done when all are, with ``result``, or the first one's error."""
    def outcome(done: torch.futures.Future) -> Any:
        for future in done.value():
            future.value()  # raises a failed collective's error
        return result
    return _Work(torch.futures.collect_all([w._future for w in works]).then(outcome))


def _op(op: Any, name: str, tensor: torch.Tensor) -> str:
    """The collectives' name of ``op`` for ``tensor``; raised at the call, as gloo raises, before anything is sent."""
    for known, label in _OPS.items():
        if op == known:
            if label in BITWISE and (tensor.is_floating_point() or tensor.is_complex()):
                raise RuntimeError(f"Cannot use {op} with non-integral dtype")
            return label
    raise NotImplementedError(f"the p2plearn backend's {name} does not implement reduce op {op}")


def _one(items: list, name: str) -> Any:
    if len(items) != 1:
        raise NotImplementedError(f"the p2plearn backend's {name} takes one tensor per rank (one device), got {len(items)}")
    return items[0]


def _array(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous host tensor (flat): a staged collective's tensors are all on the
    host. Made from the tensor's address, not ``Tensor.numpy()``, which marks the storage
    non-resizable for good (FSDP frees a gathered parameter by resizing its storage to 0)."""
    if not tensor.is_contiguous():
        raise ValueError("p2plearn: a collective's tensors must be contiguous, as gloo's")
    bits = tensor.dtype == torch.bfloat16
    dtype = np.dtype(np.uint16) if bits else _numpy_dtype(tensor.dtype)
    if tensor.numel() == 0:
        array = np.empty(0, dtype)
    else:
        memory = (ctypes.c_char * (tensor.numel() * tensor.element_size())).from_address(tensor.data_ptr())
        memory.tensor = tensor  # the view keeps the tensor alive, as .numpy()'s does
        array = np.frombuffer(memory, dtype)
    return array.view(BF16Array) if bits else array  # (bfloat16: its bits, which the reductions widen)


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


def _widened(tensor: torch.Tensor, run: Callable[[np.ndarray], Any]) -> Any:
    """``run`` reducing into the tensor's elements, as `_in_place`; a bfloat16 tensor as float32,
    rounded back to the nearest bfloat16 once, at the end (the hook's lossy all-reduce merges,
    transforms and fills float32)."""
    if tensor.dtype != torch.bfloat16:
        return _in_place(tensor, run)
    wide = tensor.detach().float().contiguous()
    out = run(_array(wide))
    tensor.detach().copy_(wide)
    return out


def _in_place(tensor: torch.Tensor, run: Callable[[np.ndarray], Any]) -> Any:
    """``run`` on the tensor's elements as a flat array, written back when the tensor is not contiguous."""
    flat = tensor.detach() if tensor.is_contiguous() else tensor.detach().contiguous()
    out = run(_array(flat))
    if flat.data_ptr() != tensor.data_ptr():
        tensor.detach().copy_(flat)
    return out


def _split_sizes(tensor: torch.Tensor, split_sizes: list[int], size: int) -> list[int]:
    """The elements of each of ``size`` pieces of ``tensor`` cut along its first dimension (equal
    pieces when ``split_sizes`` is empty), as all_to_all_single cuts it; raised at the call."""
    rows = tensor.shape[0] if tensor.dim() else 1
    if not split_sizes:
        if rows % size:
            raise ValueError(f"p2plearn: all_to_all_single: {rows} rows do not split equally among {size} ranks")
        split_sizes = [rows // size] * size
    if len(split_sizes) != size or sum(split_sizes) != rows or min(split_sizes) < 0:
        raise ValueError(f"p2plearn: all_to_all_single: split sizes {list(split_sizes)} do not cut {rows} rows "
                         f"among {size} ranks")
    per_row = tensor.numel() // max(rows, 1)
    return [n * per_row for n in split_sizes]


def _equal_pieces(whole: torch.Tensor, piece: torch.Tensor, size: int, name: str) -> list[int]:
    """The element counts of ``whole`` cut into ``size`` pieces like ``piece``; raised at the call."""
    if whole.numel() != size * piece.numel():
        raise ValueError(f"p2plearn: {name}: a tensor of {whole.numel()} elements is not {size} of "
                         f"{piece.numel()}")
    return [piece.numel()] * size


def _pieces(tensor: torch.Tensor, sizes: list[int]) -> list[np.ndarray]:
    """A contiguous host tensor's elements cut into pieces of ``sizes`` elements (views)."""
    return np.split(_array(tensor), np.cumsum(sizes)[:-1])


def _copy_back(outputs: list[torch.Tensor], flat: list[torch.Tensor]) -> None:
    for o, f in zip(outputs, flat):
        if f.data_ptr() != o.data_ptr():
            o.detach().copy_(f)


_world: ProcessGroupP2P | None = None  # this process's world group over p2plearn, while it is open
_worlds_made = 0  # world groups this process made: each after the first is a job of its own


def create(options: Any, backend_options: Any) -> ProcessGroupP2P:
    """``init_process_group("p2plearn")``'s and ``new_group``'s creator (torch's extended API): the
    world's joins the job through ``p2plearn.init()``; each group opens this rank's engines of its
    own and publishes their addresses in the group's store."""
    global _world, _worlds_made
    rank, size = options.group_rank, options.group_size
    timeout = options.timeout if options.timeout is not None else timedelta(minutes=30)
    if dist.is_initialized():  # a subgroup (torch calls this on its members only)
        if _world is None:
            raise NotImplementedError("p2plearn: a p2plearn subgroup needs the default group to be p2plearn's "
                                      "(init_process_group('p2plearn'))")
        ranks = list(options.global_ranks_in_group)
        links = Links(_world.links.uplink[ranks], _world.links.downlink[ranks])
        return _group(_world.runtime, rank, size, _store(options.store, _world.incarnation), links, timeout, ranks)
    env = dict(os.environ)
    if detect_rank(env)[:2] != (rank, size):  # given to init_process_group rather than by a launcher
        env.update(RANK=str(rank), WORLD_SIZE=str(size))
    # init_process_group again in this process (the ranks restart in step): init() makes it a job
    # of its own; its store keys need a prefix of their own too (a launcher's store outlives a world)
    incarnation, _worlds_made = _worlds_made, _worlds_made + 1
    runtime = init(environ=env, timeout=min(timeout.total_seconds(), 300.0))
    try:
        store = _store(options.store, incarnation)
        _world = _group(runtime, rank, size, store, None, timeout)
        _world.incarnation = incarnation
        return _world
    except BaseException:
        runtime.close(leave=False)
        raise


def _group(runtime: Runtime, rank: int, size: int, store: Any, links: Links | None, timeout: timedelta,
           ranks: list[int] | None = None) -> ProcessGroupP2P:
    """A group's engines (one for collectives, one for point-to-point operations), their addresses
    exchanged with the other ranks' through the group's store; the world's (``ranks`` None) is
    registered with the job, and its ``links`` (None) read from rank 0's view once every rank has
    registered."""
    largest = _largest_message(runtime)
    channel = _channel(runtime, rank, size)
    p2p_channel = _channel(runtime, rank, size)
    try:
        if ranks is None:
            runtime.register(channel.address)
        engines = _addresses(store, "engine", rank, size, channel.address)
        p2p_engines = _addresses(store, "p2p", rank, size, p2p_channel.address)
        if links is None:
            links = _links(store, runtime, size, timeout.total_seconds())
        return ProcessGroupP2P(runtime, channel, engines, p2p_channel, p2p_engines, links, timeout, largest,
                               2 * largest, world=_world if ranks is not None else None, ranks=ranks)
    except BaseException:
        channel.close()
        p2p_channel.close()
        raise


def _largest_message(runtime: Runtime) -> int:
    return int(runtime.options.max_message_mb * 2**20)


def _channel(runtime: Runtime, rank: int, size: int) -> Channel:
    """The engine of rank ``rank`` of a group of ``size``, keyed with the job's secret. What a key
    holder can make this rank hold is sized by the job's largest message: what arrives at once
    (every other rank's message of a collective, and of the next one) and what is kept of a faster
    rank's collectives ahead (the collectives' inbox, 2 x the largest message per sender)."""
    secret, job = runtime.secret, runtime.job_id
    largest = _largest_message(runtime)
    arriving = 2 * max(size - 1, 1) * (largest + CHUNK_CLAIM)
    return Channel(host=runtime.engine_host(), sender_id=rank, job_id=job,
                   key=data_key(secret.value, job) if secret else None, max_message_bytes=largest,
                   max_partial_bytes=arriving, max_queued_bytes=arriving)


def _store(store: Any, incarnation: int) -> Any:
    """The group's store under this attempt's and world's prefix: torchrun's restarts
    (--max-restarts) hand every attempt the same store, the last attempt's keys still in it, and so
    does a launcher's store to a world made again in the same process; each needs its own, or a rank
    would send to a closed engine."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"p2plearn/attempt_{restart}/world_{incarnation}/", store)


def _addresses(store: Any, name: str, rank: int, size: int, address: tuple[str, int]) -> dict[int, tuple[str, int]]:
    """Every rank's engine address of one kind, through torch's store (each get waits until that rank set it)."""
    store.set(f"{name}/{rank}", f"{address[0]}:{address[1]}")
    engines = {}
    for r in range(size):
        host, port = store.get(f"{name}/{r}").decode().rsplit(":", 1)
        engines[r] = (host, int(port))
    return engines


def _links(store: Any, runtime: Runtime, size: int, timeout: float) -> Links:
    """Every rank's uplink and downlink as rank 0's view says once it holds every rank (the
    topology's rates when the job has one, ``P2PLEARN_TOPOLOGY``; else the estimator's default for
    the hosts), published in torch's store so that every rank cuts all-reduce parts alike. A view
    read before then held no rates: every link paced at DEFAULT_RATE (1 Gbit/s), whatever it was."""
    if runtime.rank == 0:
        runtime.client.wait_members(size, timeout, receiving=True)
        view = runtime.client.view
        links = np.full((2, size), DEFAULT_RATE)
        if view is not None and view.size == size:
            links = np.where(np.stack([view.uplink, view.downlink]) > 0, np.stack([view.uplink, view.downlink]),
                             DEFAULT_RATE)
        store.set("links", json.dumps(links.tolist()))
    uplink, downlink = json.loads(store.get("links"))
    return Links(uplink, downlink)
