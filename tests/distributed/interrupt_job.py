"""Ctrl-C of a DDP job, again and again: ``interrupt_job.py BACKEND WORLD_SIZE TRIES RESULT_JSON``.

Each try forks WORLD_SIZE ranks from this process (torch is imported once, here, which keeps a try
to seconds on a busy machine), in one process group of their own; they train a small DDP model
until each has done a few steps, then the group gets SIGINT, as a terminal's Ctrl-C (or torchrun,
which sends it to each rank's group) would give it. The result: per try, the seconds from the
signal until every rank exited, and what was left of the group (the coordinator rank 0 started)
a moment later. A rank that outlives ``STUCK_S`` dumps its threads' stacks to its log.
"""
from __future__ import annotations

import faulthandler
import gc
import json
import os
import secrets
import signal
import sys
import time

import torch
import torch._dynamo  # noqa: F401  (DDP's constructor imports it: seconds, once here rather than per rank and try)
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import p2plearn  # noqa: F401  (after torch: registers the backend)
import p2plearn.distributed.backend  # noqa: F401 (imported once, here, not by every rank of every try)
from tests.distributed.job import free_port

READY_STEPS = 3
STUCK_S = 10.0  # then its stacks go to its log
GIVE_UP_S = 60.0  # then it is killed (torchrun's SIGKILL comes after 30 s)
LINGER_S = 5.0  # what is left of a try's process group (the coordinator) after its ranks exited, at most


def rank_main(backend: str, rank: int, world_size: int, ready_fd: int, log: str) -> None:
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(out, 2)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    dist.init_process_group(backend)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)),
                bucket_cap_mb=0.001)  # several buckets: a signal lands mid-backward as often as not
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while True:
        opt.zero_grad()
        model(torch.randn(16, 20)).sum().backward()
        opt.step()
        step += 1
        if step == READY_STEPS:
            os.write(ready_fd, b"r")


def one_try(backend: str, world_size: int, log: str) -> dict:
    os.environ.update(WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()), P2PLEARN_JOB_ID=f"interrupt-{secrets.token_hex(4)}",
                      P2PLEARN_JOB_KEY=secrets.token_hex(16))
    ready_r, ready_w = os.pipe()
    pids: list[int] = []
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:  # a rank: it ends as a script does, by the signal's exception out of the interpreter
            os.setpgid(0, pids[0] if pids else 0)
            os.close(ready_r)
            rank_main(backend, rank, world_size, ready_w, log)
        os.setpgid(pid, pids[0] if pids else pid)  # (both sides: whichever runs first)
        pids.append(pid)
    os.close(ready_w)
    group, ready = pids[0], b""
    forked = time.monotonic()
    end = forked + 180
    while len(ready) < world_size and time.monotonic() < end:
        ready += os.read(ready_r, world_size) or b"x" * world_size  # EOF: a rank died before it was ready
    os.close(ready_r)
    time.sleep(0.3)
    start = time.monotonic()
    os.killpg(group, signal.SIGINT)
    left, dumped = set(pids), False
    while left and time.monotonic() - start < GIVE_UP_S:
        for pid in list(left):
            if os.waitpid(pid, os.WNOHANG)[0]:
                left.discard(pid)
        if left and not dumped and time.monotonic() - start > STUCK_S:
            dumped = True
            for pid in left:
                os.kill(pid, signal.SIGUSR1)
        time.sleep(0.05)
    seconds = time.monotonic() - start
    gone_by = time.monotonic() + LINGER_S
    while _alive(group) and time.monotonic() < gone_by:
        time.sleep(0.1)
    lingering = _alive(group)  # the coordinator rank 0 started, if it outlived the ranks by LINGER_S
    for pid in left:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if lingering:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it ended meanwhile
    return {"seconds": seconds, "ready": ready == b"r" * world_size, "ready_s": start - forked, "stuck": len(left), "lingering": lingering}


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def main() -> None:
    torch.nn.Linear(2, 2)(torch.ones(1, 2)).sum().backward()  # torch's lazy start, done once, here
    gc.freeze()  # a rank's last collection at exit skips what it inherited: seconds on a busy machine
    backend, world_size, tries, result = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    log = result + ".log"
    out = [one_try(backend, world_size, log) for _ in range(tries)]
    with open(result, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
