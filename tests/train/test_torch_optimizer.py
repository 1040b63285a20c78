"""DecentralizedOptimizer behaves as a torch optimizer: schedulers, closures, GradScaler, state
dicts, buffers and half precision, in a two-peer in-process job."""
from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F

from p2plearn.train import DecentralizedOptimizer
from tests.train.conftest import on_peers


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)


def test_an_lr_scheduler_drives_the_wrapped_optimizer(job):
    def body(rank, opt):
        assert isinstance(opt, torch.optim.Optimizer)
        assert opt.param_groups is opt.optimizer.param_groups
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        lrs = []
        for i in range(3):
            x, y = batch(i)
            F.cross_entropy(opt.model(x), y).backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            lrs.append(opt.optimizer.param_groups[0]["lr"])
        return lrs, opt.sync.clock

    for lrs, clock in on_peers(job, [mlp(), mlp()], body):
        assert lrs == pytest.approx([0.05, 0.025, 0.0125])
        assert clock == 3


def test_step_returns_the_closures_loss_and_the_round_goes_to_last_round(job):
    def body(rank, opt):
        x, y = batch(rank)

        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(opt.model(x), y)
            loss.backward()
            return loss

        returned = opt.step(closure)
        return returned, opt.last_round

    for returned, rs in on_peers(job, [mlp(), mlp()], body):
        assert isinstance(returned, torch.Tensor) and returned.ndim == 0
        assert rs.round == 0 and rs.merged == 1


def test_grad_scaler_unscales_and_a_skipped_step_still_takes_its_round(job):
    reference = mlp()
    x, y = batch(0)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    F.cross_entropy(reference(x), y).backward()
    ref_opt.step()  # what one unscaled local step gives; both peers take the same one, so merging keeps it

    def body(rank, opt):
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        scaler.scale(F.cross_entropy(opt.model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        after_first = [p.detach().clone() for p in opt.model.parameters()]
        scaler.scale(F.cross_entropy(opt.model(x), y)).backward()
        next(opt.model.parameters()).grad[0, 0] = float("inf")  # overflow on both peers
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        unchanged = all(torch.equal(a, p) for a, p in zip(after_first, opt.model.parameters()))
        return after_first, unchanged, opt.sync.clock, scaler.get_scale()

    for after_first, unchanged, clock, scale in on_peers(job, [mlp(), mlp()], body):
        for got, want in zip(after_first, reference.parameters()):
            torch.testing.assert_close(got, want)
        assert unchanged, "the overflowing step changed the model"
        assert clock == 2, "the skipped step did not take part in its round"
        assert scale == 512.0, "GradScaler did not see the overflow"


def test_state_dict_round_trips_through_torch_save_with_weights_only(job):
    def body(rank, opt):
        for i in range(2):
            x, y = batch(10 * rank + i)
            F.cross_entropy(opt.model(x), y).backward()
            opt.step()
            opt.zero_grad()
        buffer = io.BytesIO()
        torch.save(opt.state_dict(), buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=True), copy.deepcopy(opt.optimizer.state_dict())

    models = [mlp(), mlp()]
    saved = on_peers(job, models, body, make_inner=lambda m: torch.optim.SGD(m.parameters(), lr=0.1,
                                                                                  momentum=0.9))
    state, inner = saved[0]
    assert state["p2plearn"]["clock"] == 2
    for a, b in zip(state["state"].values(), inner["state"].values()):
        torch.testing.assert_close(a["momentum_buffer"], b["momentum_buffer"])
    # the model as last merged, per bucket: one, as every parameter is float32
    (previous,) = state["p2plearn"]["previous"]
    assert previous.numel() == sum(p.numel() for p in models[0].parameters())


def test_load_state_dict_restores_the_clock_the_momentum_and_the_policy(job):
    source = mlp()
    inner = torch.optim.SGD(source.parameters(), lr=0.1, momentum=0.9)
    opt_state = {"state": {i: {"momentum_buffer": torch.full_like(p, 0.5)} for i, p in enumerate(source.parameters())},
                 "param_groups": copy.deepcopy(inner.state_dict()["param_groups"])}

    def body(rank, opt):
        own = opt.sync.state_dict()
        own["clock"] = 7
        own["tolerance"] = {"bound": 0.04, "_seen_round": 6}
        state = dict(copy.deepcopy(opt_state), p2plearn=own)  # torch keeps the loaded tensors: one each
        opt.load_state_dict(state)
        loaded = [opt.state[p]["momentum_buffer"].clone() for p in opt.model.parameters()]
        x, y = batch(rank)
        F.cross_entropy(opt.model(x), y).backward()
        opt.step()
        return opt.last_round.round, opt.sync.tolerance.bound, loaded

    results = on_peers(job, [mlp(), mlp()], body,
                            make_inner=lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                            tolerance="adaptive")
    for rnd, bound, momentum in results:
        assert rnd == 7, "the first round after loading is the saved clock's"
        assert bound == 0.04, "the adaptive policy's bound was not restored"
        assert all(torch.all(m == 0.5) for m in momentum), "the wrapped optimizer's state was not restored"


def test_a_state_of_another_model_is_refused(job):
    def body(rank, opt):
        own = opt.sync.state_dict()
        own["previous"] = [p[:-1] for p in own["previous"]]  # a model of one element fewer
        with pytest.raises(ValueError, match="model with tensors"):
            opt.sync.load_state_dict(own)
        opt.step()  # both peers still take their round
        return True

    assert on_peers(job, [mlp(), mlp()], body) == [True, True]


class BatchNormNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)

    def forward(self, x):
        return self.bn(self.fc(x))


@pytest.mark.parametrize("buffers", [True, False])
def test_batchnorm_statistics_are_averaged_unless_kept_local(job, buffers):
    def body(rank, opt):
        x = torch.randn(64, 8) * (1 + rank) + 3 * rank  # each peer sees other statistics
        opt.model(x).sum().backward()
        before = opt.model.bn.running_mean.clone()
        opt.step()
        return before, opt.model.bn.running_mean.clone(), int(opt.model.bn.num_batches_tracked)

    torch.manual_seed(0)
    net = BatchNormNet()
    (b0, a0, n0), (b1, a1, n1) = on_peers(job, [net, copy.deepcopy(net)], body,
                                               make_inner=lambda m: torch.optim.SGD(m.parameters(), lr=0.0),
                                               buffers=buffers)
    assert not torch.allclose(b0, b1)
    if buffers:
        torch.testing.assert_close(a0, (b0 + b1) / 2)
        torch.testing.assert_close(a1, a0)
    else:
        assert torch.equal(a0, b0) and torch.equal(a1, b1)
    assert n0 == n1 == 1, "num_batches_tracked is each peer's own count"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("value_filter", ["none", "value"])
def test_parameters_of_other_float_dtypes_are_averaged_in_their_dtype(job, dtype, value_filter):
    starts = [mlp(seed) for seed in (1, 2)]  # two different models: the average is not either

    def body(rank, opt):
        with torch.no_grad():
            for p, q in zip(opt.model.parameters(), starts[rank].parameters()):
                p.copy_(q)
        opt.step()
        return [p.detach().clone() for p in opt.model.parameters()], opt.last_round

    models = [mlp().to(dtype), mlp().to(dtype)]
    results = on_peers(job, models, body, make_inner=lambda m: torch.optim.SGD(m.parameters(), lr=0.0),
                            filter=value_filter, filter_init_scale=1e-9)  # a filter that lets everything through
    for params, rs in results:
        for p, a, b in zip(params, starts[0].parameters(), starts[1].parameters()):
            assert p.dtype == dtype
            # each peer's own values in its dtype, averaged in float64, rounded once to the dtype
            want = ((a.to(dtype).double() + b.to(dtype).double()) / 2).to(dtype)
            assert torch.equal(p, want), f"{dtype}: not the average rounded to {dtype}"
        if value_filter == "none":
            assert rs.bytes_sent == sum(p.numel() for p in params) * p.element_size()


def test_tensors_without_data_or_not_floating_point_are_refused_clearly(job):
    runtime, optimizer = job
    no_data = torch.nn.Linear(3, 3, device="meta")
    with pytest.raises(ValueError, match="weight is on meta: it holds no values to exchange"):
        DecentralizedOptimizer(torch.optim.SGD(no_data.parameters(), lr=0.1), no_data, runtime(0))
    m = torch.nn.Linear(3, 3)
    m.register_buffer("steps", torch.zeros(3, dtype=torch.int64))
    m.register_parameter("scale", torch.nn.Parameter(torch.ones(3, dtype=torch.complex64)))
    with pytest.raises(ValueError, match="scale is torch.complex64: p2plearn exchanges floating-point tensors"):
        DecentralizedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m, runtime(1))
