"""N replicas of one model in one process, stepped together: the virtual peers' models.

    replicas = Replicas(model, n, lr=0.1, momentum=0.9)
    replicas.step(x, y)               # x: [n, batch, ...], y: [n, batch]: one SGD step of every replica
    row = replicas.numpy()[i]         # replica i's parameters, flat float32, shared with the replicas
    replicas.accuracy(replicas.flat[i], x_test, y_test)

All parameters live in one [n, P] float32 tensor (row i = replica i's parameters in
`model.parameters()` order, as a training peer's message carries them), so a round's C merge
works on a row in place and a message is a row's copy. SGD with momentum is torch's rule
(buffer = momentum * buffer + grad; p -= lr * buffer; the first buffer is the gradient).

batched=True steps every replica in one call (`torch.func.functional_call` under `vmap` over the
stacked parameters); False steps them one after another through one module. On one quiet core
the two come within ~5% (256 replicas of a 105k-parameter MLP: 0.60 vs 0.64 s per step); on a
busy machine batched took half the time (`experiments/sim_budget.py` measures both).
"""
from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap


class Replicas:
    def __init__(self, model: torch.nn.Module, n: int, *, lr: float, momentum: float = 0.9, batched: bool = True):
        self.model = copy.deepcopy(model)
        self.names = [name for name, _ in self.model.named_parameters()]
        self.shapes = [p.shape for p in self.model.parameters()]
        self.sizes = [p.numel() for p in self.model.parameters()]
        start = torch.nn.utils.parameters_to_vector(self.model.parameters()).detach()
        self.flat = start.repeat(n, 1).contiguous()  # every peer starts from the same model
        self.buffer = torch.zeros_like(self.flat)
        self.n, self.lr, self.momentum, self.batched = n, lr, momentum, batched
        self._grad = vmap(grad(self._loss), in_dims=(0, 0, 0))

    @property
    def parameters(self) -> int:
        return self.flat.shape[1]

    def numpy(self) -> np.ndarray:
        """The [n, P] parameters as a numpy array sharing memory with the replicas."""
        return self.flat.numpy()

    def _views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        lead = flat.shape[:-1]
        return {name: t.reshape(*lead, *shape)
                for name, t, shape in zip(self.names, flat.split(self.sizes, dim=-1), self.shapes)}

    def _loss(self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(self.model, self._views(flat), (x,)), y)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One SGD step of every replica, replica i on its batch x[i], y[i]."""
        if self.batched:
            g = self._grad(self.flat, x, y)
        else:
            g = torch.stack([self._one_grad(self.flat[i], x[i], y[i]) for i in range(self.n)])
        self.buffer.mul_(self.momentum).add_(g)
        self.flat.sub_(self.lr * self.buffer)

    def _one_grad(self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        torch.nn.utils.vector_to_parameters(flat, self.model.parameters())
        for p in self.model.parameters():
            p.grad = None
        F.cross_entropy(self.model(x), y).backward()
        return torch.cat([p.grad.reshape(-1) for p in self.model.parameters()])

    def accuracy(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
        """Test accuracy of the model with flat parameters `params` (a row of `flat`, or an average)."""
        with torch.no_grad():
            logits = functional_call(self.model, self._views(params), (x,))
        return float((logits.argmax(1) == y).float().mean())
