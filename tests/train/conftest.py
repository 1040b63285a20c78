"""An in-process job (two peers unless a test asks for more): a coordinator, and Runtimes/optimizers
made on demand."""
from __future__ import annotations

import contextlib
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
def job(request):
    """(runtime, optimizer): see `in_process_job`. World size 2, or the test's
    ``@pytest.mark.parametrize("job", [n], indirect=True)``."""
    with in_process_job(getattr(request, "param", 2)) as made:
        yield made


@contextlib.contextmanager
def in_process_job(world_size: int = 2):
    """(runtime, optimizer): runtime(rank, join=False) -> a registered Runtime of the job;
    optimizer(rt, model, inner=None, **kw) -> its DecentralizedOptimizer (SGD lr 0.1 unless
    ``inner`` is given). Everything is closed on leaving, also on failure. A test that compares
    two jobs opens one after the other."""
    key = secrets.token_hex(16)
    coord = Coordinator(JOB, key, world_size=world_size, heartbeat=0.2).start()
    made: list[DecentralizedOptimizer] = []
    clients: list[Client] = []

    def runtime(rank: int | None, join: bool = False) -> Runtime:
        client = Client(coord.address, JOB, key, rank=rank, connect_timeout=5.0)
        clients.append(client)
        client.register(None, join=join)
        return Runtime(rank=client.rank, world_size=world_size, local_rank=0, local_world_size=1,
                       options=Options(sync="bsp", selection="all", fanout=2, period=1,  # a round per step
                                       compress="none"),  # exact averages: the tests' subject
                       job_id=JOB, client=client)

    def optimizer(rt: Runtime, model: torch.nn.Module, inner: torch.optim.Optimizer | None = None,
                  **kwargs) -> DecentralizedOptimizer:
        opt = DecentralizedOptimizer(inner or torch.optim.SGD(model.parameters(), lr=0.1), model, rt, **kwargs)
        made.append(opt)
        return opt

    try:
        yield runtime, optimizer
    finally:
        try:
            for opt in made:
                opt.close()
            for client in clients:  # those whose optimizer was never made
                client.close()
        finally:
            coord.stop()


def on_peers(job, models: list[torch.nn.Module], body: Callable[[int, DecentralizedOptimizer], object],
             make_inner: Callable[[torch.nn.Module], torch.optim.Optimizer] | None = None,
             **kwargs) -> list[object]:
    """Start ranks 0..len(models)-1 of `job` on `models`, run body(rank, opt) on all at once; their results."""
    runtime, optimizer = job
    ranks = range(len(models))
    rts = [runtime(rank) for rank in ranks]
    opts: list[DecentralizedOptimizer | None] = [None] * len(models)
    results: list[object] = [None] * len(models)
    errors: list[BaseException] = []

    def peer(rank: int) -> None:
        try:
            inner = make_inner(models[rank]) if make_inner else None
            opts[rank] = optimizer(rts[rank], models[rank], inner, **kwargs)
            results[rank] = body(rank, opts[rank])
        except BaseException as exc:  # noqa: BLE001 - reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=peer, args=(rank,)) for rank in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a peer did not finish within 60 s"
    return results
