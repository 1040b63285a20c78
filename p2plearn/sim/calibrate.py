"""What a model costs on this machine, measured once and cached: the virtual clocks of
`p2plearn.sim.train` advance by these times.

    step_s, eval_s, merge_s = costs(model_factory, "mlp-256", batch_size=32, x_test=...)

- step_s: one local step (forward, backward, SGD with momentum) of one process on one core, as a
  training peer takes it (`torch.set_num_threads(1)`);
- eval_s: the test accuracy of one model on the given test set (the peers' `--eval-every`);
- merge_s: the C merge of one received message into the model (`p2plearn.sync.merge`).

`engine_cost()` measures, once per host, the engine's CPU per byte of a message moved (sending and
receiving together: tags, copies, the receiver's buffers): two engines in this process on loopback,
unpaced, ENGINE_ROUNDS messages of ENGINE_BYTES, the process CPU time over the bytes. The simulator
charges it for peers that share a host's cores (`sim.hosts`), with `round_cost()`: a round's CPU work
per peer beyond its bytes (planning, encoding, the engine's handshakes, the report to the coordinator
and the coordinator's share, the merge of a tiny model), measured with two BSP peers as threads of
this process on loopback, every one sending to the other, ROUND_ROUNDS rounds after a warm-up; and
`pacing_cost()`: the CPU that a paced send costs the sender's engine per second it lasts, and one
receiver's engine per second of its flow, beyond their per-byte work (the pacer's and the receiver's
wake-ups, whatever the bytes): two engines with the testbed's PACED_DATAGRAM-byte datagrams, each
engine thread's own CPU clock over PACED_ROUNDS sends paced at PACED_RATE, less the same bytes' CPU
unpaced.

Each is the median of several timed blocks after a warm-up, so that one preempted block on a busy
machine does not set it; a load that shares the core for the whole calibration does (on a 2-core VM
beside two busy processes, an MLP's step came out 1.5-2.6x a quiet core's), and every later run
reuses the cached times: a calibration made with less than one idle core says so on stderr
(measure on a quiet host, or pass `recalibrate=True` there). The cache is a JSON file under
~/.cache/p2plearn (or $P2PLEARN_CACHE), keyed by the model's name, batch size, torch version and
host name.
"""
from __future__ import annotations

import json
import os
import platform
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from p2plearn.sync.merge import Contribution, merge_parameter
from p2plearn.train.data import _cache_dir

BLOCKS = 5   # timed blocks; the median is kept
WARMUP = 5   # untimed steps first (allocator, caches)
ENGINE_BYTES = 4_000_000  # a message of the engine's calibration: large, so a round's fixed cost is small
ENGINE_ROUNDS = 5
ROUND_ROUNDS = 40
PACED_DATAGRAM = 1472    # the pacing's calibration: the testbed's datagrams (a 1500-byte MTU) ...
PACED_RATE = 3e6         # ... at a rate of its shaped links' flows (bytes/s) ...
PACED_BYTES = 1_500_000  # ... for half a second a send
PACED_ROUNDS = 5


def cache_path() -> str:
    return os.path.join(_cache_dir(), "calibration.json")


def _cached(key: str, measure: Callable[[], Any], recalibrate: bool) -> Any:
    """The cache's entry `key`, or `measure()` stored there (also when `recalibrate`)."""
    path = cache_path()
    cached = _read(path)
    if key in cached and not recalibrate:
        return cached[key]
    busy = _busy()
    if busy:
        print(f"p2plearn-sim: calibrating {key!r} {busy}: the times measured (and cached) come out higher "
              f"than a quiet core's; --recalibrate on a quiet machine", file=sys.stderr)
    result = measure()
    _write(path, {**_read(path), key: result})
    return result


def costs(model_factory: Callable[[], torch.nn.Module], name: str, batch_size: int, x_test: torch.Tensor,
          y_test: torch.Tensor, *, recalibrate: bool = False) -> dict[str, float]:
    """{"step_s", "eval_s", "merge_s"} of the model `model_factory()` makes (`name` keys the cache)."""
    key = f"{name} batch {batch_size} test {len(y_test)} torch {torch.__version__} host {platform.node()}"
    return _cached(key, lambda: _measure(model_factory, batch_size, x_test, y_test), recalibrate)


def engine_cost(*, recalibrate: bool = False) -> float:
    """CPU seconds per byte of a message moved by the engine, sender and receiver together (cached
    per host and torch version, as `costs`)."""
    return _cached(f"engine per byte host {platform.node()}", _measure_engine, recalibrate)


def _measure_engine() -> float:
    from p2plearn.transport import Channel  # the compiled engine: only when a co-located run asks for it

    key = os.urandom(32)  # tags on, as in training
    sender, receiver = Channel(sender_id=0, key=key), Channel(sender_id=1, key=key)
    try:
        message = [np.ones(ENGINE_BYTES // 4, np.float32)]
        times = []
        for rnd in range(WARMUP + ENGINE_ROUNDS):
            cpu0 = time.process_time()
            handle = sender.send(rnd, message, [(*receiver.address, 0.0)])
            got = receiver.recv(timeout=30.0)
            handle.wait()
            if got is None or not got.complete:
                raise RuntimeError("the engine's calibration message did not arrive whole within 30 s")
            times.append(time.process_time() - cpu0)
        return statistics.median(times[WARMUP:]) / ENGINE_BYTES
    finally:
        sender.close()
        receiver.close()


def pacing_cost(*, recalibrate: bool = False) -> tuple[float, float]:
    """CPU seconds per second of a paced send that its sender's engine and one receiver's engine
    spend beyond their per-byte work (cached per host, as `engine_cost`)."""
    return tuple(_cached(f"pacing per second host {platform.node()}", _measure_pacing, recalibrate))


def _measure_pacing() -> list[float]:
    from p2plearn.transport import Channel  # the compiled engine: only when a co-located run asks for it

    key = os.urandom(32)
    tasks = _threads()
    sender = Channel(sender_id=0, key=key, max_datagram=PACED_DATAGRAM)
    sender_thread = _threads() - tasks
    receiver = Channel(sender_id=1, key=key, max_datagram=PACED_DATAGRAM)
    receiver_thread = _threads() - tasks - sender_thread
    try:
        clocks = [_cpu_clock(*sender_thread), _cpu_clock(*receiver_thread)]
        message = [np.ones(PACED_BYTES // 4, np.float32)]
        msg_id = iter(range(1 << 20))

        def cpu(rate: float) -> tuple[float, list[float]]:
            """(seconds, [sender's, receiver's engine CPU seconds]) of one send of the message at `rate`."""
            before, t0 = [time.clock_gettime(c) for c in clocks], time.perf_counter()
            handle = sender.send(next(msg_id), message, [(*receiver.address, rate)])
            got = receiver.recv(timeout=30.0)
            handle.wait()
            if got is None or not got.complete:
                raise RuntimeError("the engine's calibration message did not arrive whole within 30 s")
            return time.perf_counter() - t0, [time.clock_gettime(c) - b for c, b in zip(clocks, before)]

        cpu(0.0)  # warm-up
        per_byte = np.median([cpu(0.0)[1] for _ in range(ENGINE_ROUNDS)], axis=0) / PACED_BYTES
        paced = [cpu(PACED_RATE) for _ in range(PACED_ROUNDS)]
        return [float(x) for x in np.median([(np.array(used) - per_byte * PACED_BYTES) / seconds
                                              for seconds, used in paced], axis=0)]
    finally:
        sender.close()
        receiver.close()


def _threads() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def _cpu_clock(tid: int) -> int:
    """The CPU-time clock of this process's thread `tid` (Linux: what pthread_getcpuclockid gives)."""
    return ((~tid) << 3) | 6  # CPUCLOCK_SCHED of one thread


def round_cost(*, recalibrate: bool = False) -> float:
    """CPU seconds of a round's fixed work per peer (cached per host, as `engine_cost`)."""
    return _cached(f"round per peer host {platform.node()}", _measure_round, recalibrate)


def _measure_round() -> float:
    from p2plearn.control import Client, Coordinator  # a real job's parts: only when a co-located run asks
    from p2plearn.sync import BSP
    from p2plearn.tolerance import Layer, make_tolerance
    from p2plearn.transport import Channel

    secret, data_key = secrets.token_hex(16), os.urandom(32)
    coordinator = Coordinator("calibrate", secret, heartbeat=0.2, startup_grace=1.0).start()
    parts: list = []
    try:
        peers = []
        for rank in range(2):
            channel = Channel(sender_id=rank, key=data_key)
            parts.append(channel)
            client = Client(coordinator.address, "calibrate", secret, rank=rank, connect_timeout=5.0)
            parts.append(client)
            client.register(channel.address)
            peers.append(BSP([np.zeros(256, np.float32)], [Layer("w", 256, 1024, 0)], channel, client,
                             selection="all", fanout=1, seed=0, tolerance=make_tolerance("fixed")))
        for peer in peers:
            peer.client.wait_members(2, 5.0, receiving=True)

        def rounds(count: int) -> None:
            threads = [threading.Thread(target=lambda p=peer: [p.step() for _ in range(count)]) for peer in peers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        rounds(WARMUP)
        cpu0 = time.process_time()
        rounds(ROUND_ROUNDS)
        return (time.process_time() - cpu0) / (ROUND_ROUNDS * len(peers))
    finally:
        for part in parts:
            part.close()
        coordinator.stop()


def _busy() -> str:
    """Why this host's cores are not free to calibrate on ("while the 1-minute load is ..."), or "".
    One core is all a calibration uses: a load leaving less than one idle core shares it."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    return f"while the 1-minute load is {load:.1f} on {cores} cores" if load > cores - 1 else ""


def _median_block(run: Callable[[], None], per_block: int) -> float:
    for _ in range(WARMUP):
        run()
    times = []
    for _ in range(BLOCKS):
        t0 = time.perf_counter()
        for _ in range(per_block):
            run()
        times.append((time.perf_counter() - t0) / per_block)
    return statistics.median(times)


def _measure(model_factory: Callable[[], torch.nn.Module], batch_size: int, x_test: torch.Tensor,
             y_test: torch.Tensor) -> dict[str, float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each training peer runs
    try:
        torch.manual_seed(0)
        model = model_factory()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = x_test[:batch_size]
        y = y_test[:batch_size]

        def step() -> None:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()

        def evaluate() -> None:
            with torch.no_grad():
                float((model(x_test).argmax(1) == y_test).float().mean())

        flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy().copy()
        other = flat + 1.0

        def merge() -> None:
            merge_parameter(flat, [Contribution(other)])

        return {"step_s": _median_block(step, 20), "eval_s": _median_block(evaluate, 2),
                "merge_s": _median_block(merge, 20)}
    finally:
        torch.set_num_threads(threads)


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _write(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)  # concurrent runs never read half a file

