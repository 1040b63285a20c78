"""The DDP hook's randomized Hadamard transform: orthonormal, undone exactly, the same on every rank."""
import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy.linalg import hadamard

from p2plearn.compute import InvalidArgument
from p2plearn.ddp import HADAMARD_BLOCK, _hadamard, _transformed


@pytest.mark.parametrize("block", [1, 2, 4, 64, 1024])
def test_each_block_becomes_the_dense_randomized_hadamard_of_it(block):
    """H D x / sqrt(block) per block, D the signs the seed draws (read off unit vectors), and the
    inverse undoes it; the norm is kept."""
    blocks, seed = 3, 12345
    signs = np.empty(blocks * block, np.float32)
    for e in range(signs.size):  # T(unit e) = d_e H[:, e] / sqrt(block): its first entry is d_e / sqrt(block)
        unit = np.zeros(signs.size, np.float32)
        unit[e] = 1.0
        _hadamard(unit, block, seed, inverse=False)
        signs[e] = np.sign(unit[e - e % block])
    assert set(np.unique(signs)) == {-1.0, 1.0} or signs.size < 4
    x = np.random.default_rng(block).standard_normal(blocks * block).astype(np.float32)
    y = x.copy()
    _hadamard(y, block, seed, inverse=False)
    dense = hadamard(block) / np.sqrt(block)
    expected = np.concatenate([dense @ (signs[b * block:(b + 1) * block] * x[b * block:(b + 1) * block])
                               for b in range(blocks)])
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(x), rel=1e-5)
    _hadamard(y, block, seed, inverse=True)
    np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5)


def test_bad_blocks_are_refused_in_c():
    with pytest.raises(InvalidArgument, match="a power of 2"):
        _hadamard(np.zeros(6, np.float32), 3, 0, inverse=False)
    with pytest.raises(InvalidArgument, match="not whole blocks"):
        _hadamard(np.zeros(6, np.float32), 4, 0, inverse=False)


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
