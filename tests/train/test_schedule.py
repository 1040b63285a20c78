"""The communication schedule: a round every --period steps, the outer update on the averaged change
(DiLoCo), and rounds overlapped with the next period's steps or a few of them (--overlap-steps),
their result added as a change or mixed in (--overlap-alpha)."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from p2plearn.sync.outer import OuterOptimizer
from tests.train.conftest import in_process_job, on_peers


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def local_step(opt, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    F.cross_entropy(opt.model(torch.randn(32, 8, generator=g)), torch.randint(0, 3, (32,), generator=g)).backward()
    opt.step()
    opt.zero_grad()


def params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_a_round_every_period_steps_and_none_between(job):
    def body(rank, opt):
        seen = []
        for i in range(7):
            local_step(opt, 100 * rank + i)  # each peer its own batches: the models part between rounds
            seen.append((opt.sync.clock, params(opt.model)))
        return seen, opt.stats().rounds, opt.steps

    (seen0, rounds0, steps0), (seen1, rounds1, steps1) = on_peers(job, [mlp(), mlp()], body, period=3)
    assert [clock for clock, _ in seen0] == [0, 0, 1, 1, 1, 2, 2]
    assert rounds0 == rounds1 == 2 and steps0 == steps1 == 7
    for i, ((_, a), (_, b)) in enumerate(zip(seen0, seen1)):
        same = all(torch.equal(x, y) for x, y in zip(a, b))
        assert same == (i in (2, 5)), f"after step {i + 1}: the peers' models are {'' if same else 'not '}equal"


def test_the_outer_update_is_nesterov_sgd_on_the_averaged_change():
    rng = np.random.default_rng(0)
    anchor = [rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(5).astype(np.float32)]
    outer = OuterOptimizer(lr=0.7, momentum=0.9)
    reference = [torch.tensor(a.copy(), requires_grad=True) for a in anchor]
    torch_outer = torch.optim.SGD(reference, lr=0.7, momentum=0.9, nesterov=True)
    for _ in range(3):
        merged = [a + rng.standard_normal(a.shape).astype(np.float32) for a in anchor]
        for t, m in zip(reference, merged):  # DiLoCo's outer gradient: anchor - average
            t.grad = torch.from_numpy(t.detach().numpy() - m)
        torch_outer.step()
        outer.step(merged, anchor)
        for got, want in zip(merged, reference):
            np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-6, atol=1e-6)
        anchor = [m.copy() for m in merged]


def test_outer_lr_one_without_momentum_is_the_plain_average():
    outer = OuterOptimizer()
    merged = [np.arange(6, dtype=np.float32)]
    outer.step(merged, [np.zeros(6, dtype=np.float32)])
    assert outer.plain and np.array_equal(merged[0], np.arange(6, dtype=np.float32))
    with pytest.raises(ValueError, match="outer lr must be > 0"):
        OuterOptimizer(lr=0.0)


def test_peers_take_the_same_outer_step_and_keep_its_momentum_in_the_state(job):
    def body(rank, opt):
        anchor = params(opt.model)
        for i in range(2):
            local_step(opt, 10 * rank + i)
        return anchor, params(opt.model), opt.state_dict()["p2plearn"]["outer"]

    starts = [mlp(), mlp()]
    (anchor, after0, outer0), (_, after1, outer1) = on_peers(job, starts, body, period=2, outer_lr=0.5,
                                                                  outer_momentum=0.9)
    for a, b, start in zip(after0, after1, anchor):
        assert torch.equal(a, b), "the peers' outer steps differ"
    # with one round: buffer = change, model = anchor + lr * (1 + momentum) * change; the buffer is
    # per bucket (one: every tensor is float32), over the tensors in model order
    (buf,) = outer0["buffers"]
    flat = lambda tensors: torch.cat([t.reshape(-1) for t in tensors])  # noqa: E731
    torch.testing.assert_close(flat(after0), flat(anchor) + 0.5 * 1.9 * buf)
    assert all(torch.equal(x, y) for x, y in zip(outer0["buffers"], outer1["buffers"]))


def test_an_overlapped_round_adds_its_merge_to_the_steps_taken_since(job):
    snapshots: dict[int, list[torch.Tensor]] = {}
    both_started = threading.Barrier(2)

    def body(rank, opt):
        local_step(opt, rank)          # step 1 of a period of 2
        local_step(opt, 10 + rank)     # step 2: the round starts on this model and runs on
        snapshots[rank] = params(opt.model)
        both_started.wait(10)
        local_step(opt, 20 + rank)     # step 3 computes while the round runs
        before = params(opt.model)
        opt.flush()                    # the round ends; its merge lands on top of step 3
        return before, params(opt.model), opt.last_round

    results = on_peers(job, [mlp(), mlp()], body, period=2, overlap=True)
    for rank, (before, after, rs) in enumerate(results):
        assert rs.round == 0 and rs.merged == 1
        for b, a, own, s0, s1 in zip(before, after, snapshots[rank], snapshots[0], snapshots[1]):
            torch.testing.assert_close(a, b + ((s0 + s1) / 2 - own))
        assert not all(torch.equal(b, a) for b, a in zip(before, after)), "the merge changed nothing"


def test_an_overlapped_job_without_local_change_ends_at_the_average(job):
    starts = [mlp(1), mlp(2)]

    def body(rank, opt):
        opt.model.load_state_dict(starts[rank].state_dict())
        for _ in range(4):  # two rounds; lr 0: only the rounds move the model
            opt.step()
        opt.flush()
        return params(opt.model), opt.stats().rounds

    results = on_peers(job, [mlp(), mlp()], body, make_inner=lambda m: torch.optim.SGD(m.parameters(), lr=0.0),
                            period=2, overlap=True)
    for got, rounds in results:
        assert rounds == 2
        for p, a, b in zip(got, starts[0].parameters(), starts[1].parameters()):
            torch.testing.assert_close(p, (a + b) / 2)


def train_two_peers(steps: int, **options) -> list[list[torch.Tensor]]:
    """Two peers of a job of their own, each on its own batches from the same start: their models."""
    def body(rank, opt):
        for i in range(steps):
            local_step(opt, 100 * rank + i)
        opt.flush()
        return params(opt.model)

    with in_process_job(2) as job:
        return on_peers(job, [mlp(), mlp()], body, **options)


def test_a_round_landing_after_no_steps_with_alpha_one_is_the_round_in_line():
    inline = train_two_peers(7, period=2)
    mixed = train_two_peers(7, period=2, overlap_steps=0, overlap_alpha=1.0)
    for a, b in zip(inline, mixed):
        for x, y in zip(a, b):
            assert torch.equal(x, y), "--overlap-steps 0 --overlap-alpha 1 differs from a round in line"


@pytest.mark.parametrize("fragments", [1, 2])
def test_a_round_lands_after_overlap_steps_mixed_with_alpha_in_its_fragment_only(job, fragments):
    """Period 2 per fragment, tau 1, alpha 0.25: the round started after step 2 lands in step 3,
    whose local step was taken from the unmixed model: its fragment's arrays become 0.75 x the
    local step's result + 0.25 x the average of the peers' models at step 2; the others stay local."""
    snapshots: dict[int, list[torch.Tensor]] = {}
    both_started = threading.Barrier(2)

    def body(rank, opt):
        local_step(opt, rank)
        local_step(opt, 10 + rank)  # the round starts here
        snapshots[rank] = params(opt.model)
        both_started.wait(10)
        g = torch.Generator().manual_seed(20 + rank)
        F.cross_entropy(opt.model(torch.randn(32, 8, generator=g)), torch.randint(0, 3, (32,), generator=g)).backward()
        local = [p.detach() - 0.1 * p.grad for p in opt.model.parameters()]  # SGD lr 0.1, as the job's inner
        in_flight = opt.stats().rounds == 0
        opt.step()  # step 3: the local step, then the round lands
        return in_flight, local, params(opt.model), opt.stats().rounds

    results = on_peers(job, [mlp(), mlp()], body, period=2 * fragments, fragments=fragments, bucket_mb=1e-6,
                       overlap_steps=1, overlap_alpha=0.25)
    flat = lambda tensors: torch.cat([t.reshape(-1) for t in tensors])  # noqa: E731 - the model's order
    average = (flat(snapshots[0]) + flat(snapshots[1])) / 2
    carried = 195 // fragments  # fragment 0 of 2: the first 390 of 780 bytes (inside the first weight)
    for in_flight, local, after, rounds in results:
        assert in_flight and rounds == 1, "the round did not land at step 3"
        got, mine = flat(after), flat(local)
        torch.testing.assert_close(got[:carried], 0.75 * mine[:carried] + 0.25 * average[:carried])
        torch.testing.assert_close(got[carried:], mine[carried:])  # not mixed: the average is far from it


def test_partitioned_rounds_average_whole_models_through_the_optimizer(job):
    starts = [mlp(1), mlp(2)]

    def body(rank, opt):
        opt.model.load_state_dict(starts[rank].state_dict())
        opt.step()
        return params(opt.model), opt.last_round

    results = on_peers(job, [mlp(), mlp()], body, make_inner=lambda m: torch.optim.SGD(m.parameters(), lr=0.0),
                            sync="partitioned")
    model_bytes = sum(p.numel() * 4 for p in starts[0].parameters())
    for got, rs in results:
        assert rs.merged == 1 and rs.bytes_sent == pytest.approx(model_bytes, rel=0.05)  # 2(n-1)/n, n = 2
        for p, a, b in zip(got, starts[0].parameters(), starts[1].parameters()):
            torch.testing.assert_close(p, (a + b) / 2)
