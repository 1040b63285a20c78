"""CUDA models: 4 peers sharing one GPU train as the same peers do on the CPU, to rounding.
Skipped where CUDA is absent (CI); the CPU tests of the same path are tests/train/test_staging.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.train.conftest import in_process_job, on_peers
from tests.train.test_staging import assert_close, batch, net

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (no GPU on this machine)")


def train_on(device: str, peers: int, steps: int, dtype: torch.dtype = torch.float32, **options):
    """Each rank trains `net(rank)` on `device` for `steps` steps; its final state, on the CPU."""
    torch.backends.cuda.matmul.allow_tf32 = False  # the CPU computes in float32: so does the GPU
    torch.backends.cudnn.allow_tf32 = False

    def body(rank, opt):
        for step in range(steps):
            x, y = batch(100 * rank + step, dtype)
            F.cross_entropy(opt.model(x.to(device)).float(), y.to(device)).backward()
            opt.step()
            opt.zero_grad()
        opt.flush()
        return {name: t.detach().to("cpu") for name, t in opt.model.state_dict().items()}

    models = [net(rank, dtype).to(device) for rank in range(peers)]
    with in_process_job(peers) as job:
        return on_peers(job, models, body, **options)


@pytest.mark.parametrize("sync,overlap", [("bsp", False), ("bsp", True), ("ssp", False), ("partitioned", False),
                                          ("partitioned", True)])
def test_four_peers_on_one_gpu_train_as_on_the_cpu(sync, overlap):
    kw = {"sync": sync, "overlap": overlap, **({"staleness": 0} if sync == "ssp" else {})}
    gpu = train_on("cuda", 4, 4, **kw)
    cpu = train_on("cpu", 4, 4, **kw)
    assert_close(gpu, cpu, tol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models_on_the_gpu_train_as_on_the_cpu(dtype):
    gpu = train_on("cuda", 4, 3, dtype)
    cpu = train_on("cpu", 4, 3, dtype)
    assert_close(gpu, cpu, tol=2e-2)


def test_a_gpu_model_is_staged_through_pinned_buffers_on_a_side_stream():
    def body(rank, opt):
        x, y = batch(rank)
        F.cross_entropy(opt.model(x.cuda()), y.cuda()).backward()
        opt.step()
        torch.cuda.synchronize()
        staging = opt.staging
        return (staging.staged, all(h.is_pinned() for h in staging.host), staging._side is not None,
                all(f.is_cuda for f in opt.buckets.flats),
                all(torch.equal(h, f.cpu()) for h, f in zip(staging.host, opt.buckets.flats)))

    with in_process_job(2) as job:
        assert on_peers(job, [net(0).cuda(), net(1).cuda()], body) == [(True, True, True, True, True)] * 2
