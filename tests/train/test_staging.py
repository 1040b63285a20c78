"""The device path on the CPU: ``staging="host"`` sends a CPU model through separate host buffers
and the copies a CUDA model takes; training with it equals the direct path to rounding."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.train.conftest import in_process_job, on_peers


def net(seed: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A small model with floating buffers (BatchNorm's running statistics) that travel too."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 3)).to(dtype)


def batch(seed: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(32, 8, generator=g).to(dtype), torch.randint(0, 3, (32,), generator=g)


def train(peers: int, steps: int, models=None, make_inner=None, **options) -> list[dict[str, torch.Tensor]]:
    """Each rank trains its own `net` (different starts, so merges change things) on its own
    batches for `steps` steps in a fresh job; each rank's final model state."""
    models = models or [net(rank) for rank in range(peers)]

    def body(rank, opt):
        dtype = next(opt.model.parameters()).dtype
        for step in range(steps):
            x, y = batch(100 * rank + step, dtype)
            F.cross_entropy(opt.model(x).float(), y).backward()
            opt.step()
            opt.zero_grad()
        opt.flush()
        return {name: t.detach().clone() for name, t in opt.model.state_dict().items()}

    with in_process_job(peers) as job:
        return on_peers(job, models, body, make_inner, **options)


def assert_close(a: list[dict], b: list[dict], tol: float = 1e-6) -> None:
    for one, other in zip(a, b):
        assert one.keys() == other.keys()
        for name in one:
            assert torch.allclose(one[name].double(), other[name].double(), rtol=tol, atol=tol), name


@pytest.mark.parametrize("sync,overlap", [("bsp", False), ("bsp", True), ("ssp", False), ("ssp", True),
                                          ("partitioned", False), ("partitioned", True)])
def test_forced_staging_trains_as_the_direct_path(sync, overlap):
    """3 peers, 4 steps, a round each (SSP with staleness 0, so that what merges does not depend
    on timing): the staged run equals the direct one to rounding. With --overlap a CPU model
    takes separate host buffers either way; what the overlapped merge adds is checked against
    its definition in test_schedule.py."""
    kw = {"sync": sync, "overlap": overlap, **({"staleness": 0} if sync == "ssp" else {})}
    direct = train(3, 4, staging="direct", **kw)
    staged = train(3, 4, staging="host", **kw)
    assert_close(direct, staged)
    assert not torch.equal(direct[0]["0.weight"], net(0)[0].weight), "the model never changed"
    if not overlap:
        assert_close(direct[:1], direct[1:2], tol=1e-5)  # a full average each round


def test_staged_rounds_use_separate_host_buffers_and_the_model_sees_the_result():
    def body(rank, opt):
        host = opt.staging.host[0]
        model_flat = opt.buckets.flats[0]
        separate = host.data_ptr() != model_flat.data_ptr()
        x, y = batch(rank)
        F.cross_entropy(opt.model(x), y).backward()
        opt.step()
        # after the round, the model holds what the host buffer merged
        return separate, torch.equal(host, model_flat)

    with in_process_job(2) as job:
        assert on_peers(job, [net(0), net(1)], body, staging="host") == [(True, True)] * 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("overlap", [False, True])
def test_forced_staging_of_half_precision_models(dtype, overlap):
    """float16 and bfloat16 models (BatchNorm in float32 would mix dtypes: the whole model is
    half here); the overlap path adds each change in float32 and rounds once."""
    models = lambda: [net(rank, dtype) for rank in range(2)]  # noqa: E731
    direct = train(2, 4, models(), staging="direct", overlap=overlap)
    staged = train(2, 4, models(), staging="host", overlap=overlap)
    assert_close(direct, staged, tol=1e-2 if dtype == torch.bfloat16 else 1e-3)


def test_mixed_precision_with_a_master_copy_through_staging():
    """A bfloat16 model stepped through a float32 master copy (the optimizer holds float32
    parameters; the model's are refreshed from them): the exchanged tensors are the model's."""

    class MasterSGD(torch.optim.Optimizer):
        def __init__(self, model: torch.nn.Module, lr: float):
            self.model_params = list(model.parameters())
            self.master = [p.detach().float().clone().requires_grad_() for p in self.model_params]
            super().__init__(self.master, {"lr": lr})

        @torch.no_grad()
        def step(self, closure=None):
            for p, m in zip(self.model_params, self.master):
                m.copy_(p)  # the round may have changed the model: start from it
                m -= self.param_groups[0]["lr"] * p.grad.float()
                p.copy_(m)

    models = [net(rank, torch.bfloat16) for rank in range(2)]
    states = train(2, 3, models, make_inner=lambda m: MasterSGD(m, 0.1), staging="host")
    assert_close(states[:1], states[1:], tol=1e-2)
    assert all(t.dtype == torch.bfloat16 for t in states[0].values() if t.is_floating_point())


def test_gradscaler_steps_through_staging():
    def body(rank, opt):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        for step in range(3):
            x, y = batch(10 * rank + step)
            scaler.scale(F.cross_entropy(opt.model(x), y)).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        return {n: t.clone() for n, t in opt.model.state_dict().items()}

    with in_process_job(2) as job:
        staged = on_peers(job, [net(0), net(1)], body, staging="host")
    with in_process_job(2) as job:
        direct = on_peers(job, [net(0), net(1)], body, staging="direct")
    assert_close(direct, staged)


def test_model_copy_is_a_copy_taken_now():
    def body(rank, opt):
        copy = opt.staging.model_copy()
        with torch.no_grad():
            opt.model[0].weight.add_(1.0)
        return np.allclose(copy[0][:8 * 16] + 1.0, opt.model[0].weight.detach().numpy().reshape(-1))

    with in_process_job(2) as job:
        assert on_peers(job, [net(0), net(1)], body, staging="host") == [True, True]
