"""The DDP hook's randomized Hadamard transform: orthonormal, undone exactly, the same on every rank."""
import subprocess
import sys

import pytest
import torch

from p2plearn.ddp import HADAMARD_BLOCK, _fwht, _transformed


def test_walsh_hadamard_is_orthonormal_and_its_own_inverse():
    x = torch.randn(3, 64, dtype=torch.float64)
    y = _fwht(x)
    assert torch.allclose(y.norm(dim=1), x.norm(dim=1))
    assert torch.allclose(_fwht(y), x)
    assert torch.allclose(_fwht(torch.eye(4, dtype=torch.float64)) * 2, torch.tensor(
        [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]], dtype=torch.float64))


def test_transform_is_undone_per_layer_and_seeded_alike():
    numels = [5, 1, 3 * HADAMARD_BLOCK + 7]  # padded to whole blocks: 8, 2, 4 blocks
    buffer = torch.randn(sum(numels))
    original = buffer.clone()
    flat, sizes, restore = _transformed(buffer, numels, seed=1, index=0, round=3)
    assert sizes == [8, 2, 4 * HADAMARD_BLOCK] and flat.numel() == sum(sizes)
    again, _, _ = _transformed(original.clone(), numels, seed=1, index=0, round=3)
    other, _, _ = _transformed(original.clone(), numels, seed=1, index=0, round=4)
    assert torch.equal(flat, again) and not torch.equal(flat, other)  # same signs for the same round only
    buffer.zero_()
    restore()
    assert torch.allclose(buffer, original, atol=1e-5)


@pytest.mark.slow  # a fresh interpreter imports torch
def test_importing_p2plearn_after_torch_registers_the_backend():
    code = "import torch, torch.distributed as dist, p2plearn; print('P2PLEARN' in dist.Backend._plugins)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr
