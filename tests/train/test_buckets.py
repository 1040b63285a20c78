"""Buckets: the exchanged tensors as views of a few flat tensors; rounds over buckets give what
rounds over each tensor gave, torch optimizers step the views, and per-layer bounds keep to
their layers' bytes."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from p2plearn.sync import BSP
from p2plearn.sync.bfloat16 import store, values
from p2plearn.tolerance import Layer, make_tolerance
from p2plearn.train.buckets import Buckets
from p2plearn.train.optimizer import describe_layers, exchanged_tensors
from p2plearn.train.staging import numpy_view
from tests.train.conftest import in_process_job, on_peers
from tests.train.test_staging import assert_close

PER_TENSOR_MB = 1e-9  # a cap below any tensor: one bucket per tensor, as rounds were before buckets


class ManyTensors(torch.nn.Module):
    """`n` small linear layers in a chain (2n tensors), and optionally bfloat16 ones beside them."""

    def __init__(self, n: int, width: int = 4, bf16: int = 0):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(n))
        self.side = torch.nn.ModuleList(torch.nn.Linear(width, width).to(torch.bfloat16) for _ in range(bf16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        for layer in self.side:
            x = x + layer(x.to(torch.bfloat16)).float()
        return x


def many(seed: int, n: int = 150, width: int = 4, bf16: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return ManyTensors(n, width, bf16)


def train(models, steps: int = 3, make_inner=None, **options) -> list[dict[str, torch.Tensor]]:
    def body(rank, opt):
        width = opt.model.layers[0].in_features
        for step in range(steps):
            g = torch.Generator().manual_seed(100 * rank + step)
            x, y = torch.randn(16, width, generator=g), torch.randn(16, width, generator=g)
            F.mse_loss(opt.model(x), y).backward()
            opt.step()
            opt.zero_grad()
        opt.flush()
        return {name: t.detach().clone() for name, t in opt.model.state_dict().items()}

    with in_process_job(len(models)) as job:
        return on_peers(job, models, body, make_inner, **options)


def test_tensors_become_views_of_buckets_grouped_by_dtype_and_capped():
    model = many(0, n=3, width=4, bf16=2)
    before = {name: t.detach().clone() for name, t in model.state_dict().items()}
    tensors = exchanged_tensors(model)
    # 3 float32 layers of 20 elements (80 bytes each); a cap of 100 bytes closes a bucket per layer
    buckets = Buckets(tensors, cap_bytes=100)
    assert [f.dtype for f in buckets.flats] == [torch.float32] * 3 + [torch.bfloat16]
    assert [f.numel() for f in buckets.flats] == [20, 20, 20, 40]
    for (name, t), slot in zip(tensors.items(), buckets.slots):
        flat = buckets.flats[slot.bucket]
        assert t.data_ptr() == flat[slot.start:slot.end].data_ptr(), name
        assert torch.equal(t, before[name]), "packing changed a value"
    with torch.no_grad():
        model.layers[1].bias.add_(1.0)
    assert torch.equal(buckets.flats[1][16:20], before["layers.1.bias"] + 1.0), "the bucket is not the tensor's memory"
    one = Buckets(exchanged_tensors(many(0, n=3)), cap_bytes=2**20)
    assert len(one.flats) == 1 and one.ranges()[-1] == (0, 56, 60)


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False),
    lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True),
    lambda ps: torch.optim.AdamW(ps, lr=0.01, fused=True),
], ids=["sgd", "adamw", "adamw-foreach", "adamw-fused"])
def test_torch_optimizers_step_bucket_views_as_they_step_tensors(make):
    """The same model stepped as plain tensors and as bucket views: the same values, bit for bit."""
    plain, packed = many(0, n=4), many(0, n=4)
    Buckets(exchanged_tensors(packed), cap_bytes=64)  # several buckets, tensors not aligned to them
    opts = [make(list(m.parameters())) for m in (plain, packed)]
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
        for m, opt in zip((plain, packed), opts):
            F.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(plain.parameters(), packed.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("n", [1, 150])
def test_rounds_over_buckets_equal_rounds_over_each_tensor(n):
    """3 peers, 3 tensors (one layer of 4x4... as 1 or 150 layers): the default buckets and one
    bucket per tensor (how rounds went before buckets) give the same models, bit for bit."""
    bucketed = train([many(rank, n) for rank in range(3)])
    per_tensor = train([many(rank, n) for rank in range(3)], bucket_mb=PER_TENSOR_MB)
    for a, b in zip(bucketed, per_tensor):
        assert all(torch.equal(a[name], b[name]) for name in a)
    assert not torch.equal(bucketed[0]["layers.0.weight"], many(0, n).layers[0].weight)


def test_a_model_of_float32_and_bfloat16_tensors_trains_in_two_buckets():
    def body(rank, opt):
        return [f.dtype for f in opt.buckets.flats]

    with in_process_job(2) as job:
        assert on_peers(job, [many(0, 3, bf16=2), many(1, 3, bf16=2)], body) == [[torch.float32, torch.bfloat16]] * 2
    bucketed = train([many(rank, 3, bf16=2) for rank in range(2)])
    per_tensor = train([many(rank, 3, bf16=2) for rank in range(2)], bucket_mb=PER_TENSOR_MB)
    for a, b in zip(bucketed, per_tensor):
        assert all(torch.equal(a[name], b[name]) for name in a)
    assert_close(bucketed[:1], bucketed[1:], tol=0)  # a full average each round


def test_layerwise_rounds_over_buckets_equal_rounds_over_each_tensor():
    """Per-layer bounds cut a bucket into one segment per bound: without loss every segment
    arrives, and the merge is the per-tensor one."""
    kw = {"tolerance": "layerwise", "loss_bound": 0.05}
    bucketed = train([many(rank, 20) for rank in range(2)], **kw)
    per_tensor = train([many(rank, 20) for rank in range(2)], bucket_mb=PER_TENSOR_MB, **kw)
    for a, b in zip(bucketed, per_tensor):
        assert all(torch.equal(a[name], b[name]) for name in a)


class _NoChannel:
    """What a synchronizer's constructor reads of a channel (no round is run here)."""

    def recv(self, timeout=None):
        return None


def test_a_layers_bound_covers_exactly_its_bytes_in_the_bucket():
    model = many(0, n=3)
    tensors = exchanged_tensors(model)
    buckets = Buckets(tensors, cap_bytes=2**20)
    arrays = [f.numpy() for f in buckets.flats]
    sync = BSP(arrays, describe_layers(model), _NoChannel(), None, selection="all", fanout=1, seed=0,
               tolerance=make_tolerance("fixed"), layer_ranges=buckets.ranges())
    bounds = [0.0, 0.0, 0.2, 0.0, 0.1, 0.1]  # per tensor: w0 b0 w1 b1 w2 b2
    message = sync.codec.encode(0, sync.fragments.arrays(0))
    segments, wire = sync.codec.wire(message, bounds)
    assert wire == [0.0, 0.2, 0.0, 0.1]
    layer_bytes = [t.numel() * 4 for t in tensors.values()]  # 64 16 64 16 64 16
    starts = np.cumsum([0] + layer_bytes)
    # each segment covers the bytes of its layers, in the bucket's own memory
    assert [s.ctypes.data - arrays[0].ctypes.data for s in segments] == [starts[0], starts[2], starts[3], starts[4]]
    assert [s.nbytes for s in segments] == [80, 64, 16, 80]
    uniform, uniform_wire = sync.codec.wire(message, [0.05] * 6)
    assert len(uniform) == 1 and uniform[0].size == 60 and uniform_wire == [0.05]
    assert sync.array_bounds(bounds) == [0.0]  # a part of a bucket keeps to its smallest layer bound


def test_update_norms_from_buckets_are_each_tensors_change():
    model = many(0, n=5, bf16=1)
    buckets = Buckets(exchanged_tensors(model), cap_bytes=2**20)
    arrays = [numpy_view(f) for f in buckets.flats]  # bfloat16 buckets as a BF16Array, as training has them
    sync = BSP([a.copy() for a in arrays], describe_layers(model), _NoChannel(), None, selection="all", fanout=1,
               seed=0, tolerance=make_tolerance("layerwise"), layer_ranges=buckets.ranges())  # a policy that reads them
    before = [values(p).copy() for p in sync.params]
    rng = np.random.default_rng(1)
    for p in sync.params:
        store(p, values(p) + rng.standard_normal(p.size).astype(np.float32))
    sync._track_updates(None)
    for norm, (b, lo, hi) in zip(sync.training.layer_update_norms[-1], buckets.ranges()):
        change = values(sync.params[b])[lo:hi] - before[b][lo:hi]
        assert norm == pytest.approx(float(np.linalg.norm(change)), rel=1e-5)
    assert len(sync.training.layer_update_norms[-1]) == len(describe_layers(model))


def test_update_norms_are_measured_only_for_a_policy_that_reads_them():
    model = many(0, n=3)
    buckets = Buckets(exchanged_tensors(model), cap_bytes=2**20)
    for policy, measured in (("fixed", 0), ("adaptive", 0), ("layerwise", 1), ("phase", 1)):
        sync = BSP([numpy_view(f).copy() for f in buckets.flats], describe_layers(model), _NoChannel(), None,
                   selection="all", fanout=1, seed=0, tolerance=make_tolerance(policy), layer_ranges=buckets.ranges())
        sync._track_updates(None)
        assert len(sync.training.layer_update_norms) == measured, policy


def test_layer_ranges_must_match_the_layers():
    with pytest.raises(ValueError, match="2 layer ranges for 1 layers"):
        BSP([np.zeros(4, np.float32)], [Layer("a", 4, 16, 0)], _NoChannel(), None, selection="all", fanout=1,
            seed=0, tolerance=make_tolerance("fixed"), layer_ranges=[(0, 0, 2), (0, 2, 4)])


def test_a_round_of_300_tensors_sends_and_merges_one_bucket(monkeypatch):
    """The Python work that grew with the tensors (a segment each, a merge call each) is per bucket."""
    import p2plearn.sync.merge as merging

    merges, segments = [], []
    merge = merging.merge_parameter  # (what a round's merge calls: nothing was folded before its end)
    monkeypatch.setattr(merging, "merge_parameter", lambda own, cs: merges.append(own.size) or merge(own, cs))

    def body(rank, opt):
        send = opt.channel.send
        opt.channel.send = lambda msg_id, arrays, *a, **kw: segments.append(len(arrays)) or send(msg_id, arrays, *a, **kw)
        x = torch.randn(4, 4)
        F.mse_loss(opt.model(x), x).backward()
        opt.step()
        return len(exchanged_tensors(opt.model))

    with in_process_job(2) as job:
        assert on_peers(job, [many(0), many(1)], body) == [300, 300]
    assert segments == [1, 1] and merges == [150 * 20] * 2  # per peer: one message, one merge of the whole model
