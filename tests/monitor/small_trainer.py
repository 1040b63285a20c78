"""A peer of the monitor's end-to-end tests: a linear model, a round every 2 steps, 60 steps of
20 ms each at least (the plan is seen over several of the coordinator's 0.5 s ticks)."""

import time

import torch

import p2plearn

runtime = p2plearn.init()
torch.manual_seed(runtime.rank)
model = torch.nn.Linear(8, 2)
opt = p2plearn.DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, runtime, period=2)
x = torch.randn(64, 8)
y = (x[:, 0] > 0).long()
for _ in range(60):
    time.sleep(0.02)  # stands for a real model's compute
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step(loss=loss)
    opt.zero_grad()
opt.close()
