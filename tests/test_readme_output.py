"""What the README's loops and the examples print is true: every step hands the optimizer its loss
(else the progress line reads `loss -`), and a run's header names only settings that apply."""

import re
from pathlib import Path

import torch
import torch.nn.functional as F

from p2plearn.examples.mnist1d import settings
from p2plearn.options import Options

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
LOOPS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_every_step_of_the_readme_loops_hands_on_the_loss():
    """Issue 44: the checkpointed loop's `scaler.step(opt)` passed no loss: its progress read `loss -`."""
    steps = [line.strip() for loop in LOOPS for line in loop.splitlines()
             if re.search(r"\b(opt\.step|scaler\.step)\(", line)]
    assert len(steps) >= 2, steps  # the training script's and the checkpointed loop's
    assert all("loss=loss" in step for step in steps), steps


def test_grad_scaler_hands_the_loss_on_to_the_optimizer():
    """`scaler.step(opt, loss=loss)`, as the README writes it, reaches `opt.step(loss=...)`."""
    model = torch.nn.Linear(4, 2)
    seen = []

    class Recording(torch.optim.SGD):
        def step(self, closure=None, loss=None):
            seen.append(loss)
            return super().step(closure)

    opt, scaler = Recording(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu")
    loss = F.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,)))
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    scaler.step(opt, loss=loss)
    assert seen == [loss]


def test_the_header_names_a_staleness_only_under_ssp():
    """Issue 44: the BSP header printed `staleness=2`."""
    assert "staleness" not in settings(Options(sync="bsp"))
    assert "staleness" not in settings(Options(sync="partitioned"))
    assert settings(Options(sync="ssp", staleness=3)).startswith("sync=ssp staleness=3 ")
