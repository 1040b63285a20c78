"""Where an array sits among its message's chunks: per element, and whether all of it arrived."""
import numpy as np
import pytest

from p2plearn.transport.delivery import ChunkMask


@pytest.mark.parametrize("first_byte", [0, 8, 64, 1000])
@pytest.mark.parametrize("count", [0, 1, 15, 16, 17, 400])
def test_whole_says_what_the_element_mask_says(first_byte, count):
    rng = np.random.default_rng(first_byte + count)
    chunk_size, itemsize = 64, 4
    nchunks = (first_byte + count * itemsize + chunk_size - 1) // chunk_size + 1
    for _ in range(20):
        mask = ChunkMask(rng.random(nchunks) < 0.9, first_byte, chunk_size)
        elements = mask.elements(count, itemsize)
        assert elements.size == count
        assert mask.whole(count, itemsize) == bool(elements.all())


def test_a_lost_chunk_outside_the_array_does_not_count():
    arrived = np.array([False, True, True, False])
    assert ChunkMask(arrived, 64, 64).whole(32, 4)       # chunks 1 and 2
    assert not ChunkMask(arrived, 64, 64).whole(33, 4)   # one element into chunk 3
