"""sim.replicas: the linear path steps the replicas as the vmap and one-after-another paths do."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from p2plearn.examples.mnist1d import CNN, MLP
from p2plearn.sim.replicas import Replicas


def stack(activation: type[nn.Module], bias: bool = True) -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16, bias=bias), activation(), nn.Linear(16, 12, bias=bias), activation(),
                         nn.Linear(12, 4, bias=bias))


def stepped(model: nn.Module, n: int, path: str, steps: int, x: torch.Tensor, y: torch.Tensor,
            group: int = 64) -> tuple[Replicas, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The replicas, and their (parameters, momentum buffer) after each of `steps` steps, step k on batch k."""
    replicas = Replicas(model, n, lr=0.1, momentum=0.9, path=path, group=group)
    after = []
    for k in range(steps):
        replicas.step(x[k], y[k])
        after.append((replicas.flat.clone(), replicas.buffer.clone()))
    return replicas, after


@pytest.mark.parametrize("activation,bias,n,group",
                         [(nn.ReLU, True, 2, 64), (nn.GELU, True, 8, 3), (nn.Tanh, False, 5, 64)])
def test_linear_path_gives_the_other_paths_gradients_and_parameters(activation, bias, n, group):
    torch.manual_seed(0)
    model = stack(activation, bias)
    steps = 4
    x, y = torch.randn(steps, n, 8, 6), torch.randint(0, 4, (steps, n, 8))
    linear, linear_after = stepped(model, n, "auto", steps, x, y, group)
    assert linear.path == "linear"
    for path in ("vmap", "sequential"):
        other, other_after = stepped(model, n, path, steps, x, y)
        assert other.path == path
        # the first buffer is the gradient; later ones and the parameters accumulate every step's
        for (flat, buffer), (other_flat, other_buffer) in zip(linear_after, other_after):
            torch.testing.assert_close(buffer, other_buffer, rtol=0, atol=1e-5)
            torch.testing.assert_close(flat, other_flat, rtol=0, atol=1e-5)
    assert not torch.equal(linear.flat[0], linear.flat[1])  # each replica stepped on its own batch


def test_the_mnist1d_mlp_takes_the_linear_path():
    torch.manual_seed(0)
    assert Replicas(MLP(16), 2, lr=0.1).path == "linear"


def test_an_in_place_activation_steps_as_an_out_of_place_one():
    torch.manual_seed(0)
    model = stack(nn.ReLU)
    in_place = nn.Sequential(*[nn.ReLU(inplace=True) if isinstance(m, nn.ReLU) else m for m in model])
    x, y = torch.randn(1, 2, 8, 6), torch.randint(0, 4, (1, 2, 8))
    replicas, _ = stepped(in_place, 2, "auto", 1, x, y)
    reference, _ = stepped(model, 2, "vmap", 1, x, y)
    assert replicas.path == "linear"
    torch.testing.assert_close(replicas.flat, reference.flat, rtol=0, atol=1e-5)


class Residual(nn.Module):
    """Linear layers only, but not a stack: the probe sees the skip connection."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)) + x)


class Reordered(nn.Module):
    """A stack whose layers are registered in another order than they run."""

    def __init__(self):
        super().__init__()
        self.head, self.body = nn.Linear(8, 4), nn.Linear(6, 8)

    def forward(self, x):
        return self.head(self.body(x))


@pytest.mark.parametrize("model", [lambda: CNN(4), Residual, Reordered,
                                   lambda: nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 4)),
                                   lambda: nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 4))])
def test_other_models_fall_back_to_vmap(model):
    torch.manual_seed(0)
    replicas = Replicas(model(), 2, lr=0.1)
    assert replicas.path == "vmap"
    with pytest.raises(ValueError, match="not a stack"):
        Replicas(model(), 2, lr=0.1, path="linear")


def test_choosing_the_path_leaves_the_global_seed_alone():
    torch.manual_seed(0)
    Replicas(stack(nn.ReLU), 2, lr=0.1)
    after = torch.rand(3)
    torch.manual_seed(0)
    stack(nn.ReLU)
    assert torch.equal(torch.rand(3), after)


@pytest.mark.parametrize("kwargs", [{"path": "jit"}, {"group": 0}])
def test_refuses_an_unknown_path_or_an_empty_group(kwargs):
    with pytest.raises(ValueError):
        Replicas(stack(nn.ReLU), 2, lr=0.1, **kwargs)


@pytest.mark.parametrize("path", ["auto", "vmap", "sequential"])
def test_step_returns_each_replicas_loss_before_the_step(path):
    torch.manual_seed(0)
    model = stack(nn.ReLU)
    n = 3
    x, y = torch.randn(2, n, 8, 6), torch.randint(0, 4, (2, n, 8))
    replicas = Replicas(model, n, lr=0.1, momentum=0.9, path=path)
    replicas.step(x[0], y[0])  # the replicas now differ
    before = replicas.flat.clone()
    losses = replicas.step(x[1], y[1])
    for i in range(n):
        torch.nn.utils.vector_to_parameters(before[i], model.parameters())
        with torch.no_grad():
            expected = torch.nn.functional.cross_entropy(model(x[1, i]), y[1, i])
        torch.testing.assert_close(losses[i], expected, rtol=0, atol=1e-5)
