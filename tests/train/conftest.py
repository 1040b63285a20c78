"""An in-process job of two peers: a coordinator, and Runtimes/optimizers made on demand."""
from __future__ import annotations

import secrets
import threading
from typing import Callable

import pytest
import torch

from p2plearn.control import Client, Coordinator
from p2plearn.options import Options
from p2plearn.runtime import Runtime
from p2plearn.train import DecentralizedOptimizer

JOB = "train-test"


@pytest.fixture
def job():
    """(runtime, optimizer): runtime(rank, join=False) -> a registered Runtime of the job;
    optimizer(rt, model, inner=None, **kw) -> its DecentralizedOptimizer (SGD lr 0.1 unless
    ``inner`` is given). Everything is closed after the test."""
    key = secrets.token_hex(16)
    coord = Coordinator(JOB, key, world_size=2, heartbeat=0.2).start()
    made: list[DecentralizedOptimizer] = []
    clients: list[Client] = []

    def runtime(rank: int | None, join: bool = False) -> Runtime:
        client = Client(coord.address, JOB, key, rank=rank, connect_timeout=5.0)
        clients.append(client)
        client.register(None, join=join)
        return Runtime(rank=client.rank, world_size=2, local_rank=0, local_world_size=1,
                       options=Options(sync="bsp", selection="all", fanout=2), job_id=JOB, client=client)

    def optimizer(rt: Runtime, model: torch.nn.Module, inner: torch.optim.Optimizer | None = None,
                  **kwargs) -> DecentralizedOptimizer:
        opt = DecentralizedOptimizer(inner or torch.optim.SGD(model.parameters(), lr=0.1), model, rt, **kwargs)
        made.append(opt)
        return opt

    yield runtime, optimizer
    for opt in made:
        opt.close()
    for client in clients:  # those whose optimizer was never made
        client.close()
    coord.stop()


def on_both_peers(job, models: list[torch.nn.Module], body: Callable[[int, DecentralizedOptimizer], object],
                  make_inner: Callable[[torch.nn.Module], torch.optim.Optimizer] | None = None,
                  **kwargs) -> list[object]:
    """Start ranks 0 and 1 of `job` on `models`, run body(rank, opt) on both at once; their results."""
    runtime, optimizer = job
    rts = [runtime(0), runtime(1)]
    opts: list[DecentralizedOptimizer | None] = [None, None]
    results: list[object] = [None, None]
    errors: list[BaseException] = []

    def peer(rank: int) -> None:
        try:
            inner = make_inner(models[rank]) if make_inner else None
            opts[rank] = optimizer(rts[rank], models[rank], inner, **kwargs)
            results[rank] = body(rank, opts[rank])
        except BaseException as exc:  # noqa: BLE001 - reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=peer, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a peer did not finish within 60 s"
    return results
