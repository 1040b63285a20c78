"""What a receiver gets: one message from one sender, with the mask of what arrived."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np


@dataclass(frozen=True)
class ChunkMask:
    """Which chunks of a message arrived, and where one of its arrays sits among them: element e
    of the array is in chunk (first_byte + e * itemsize) // chunk_size."""

    arrived: np.ndarray  # bool per chunk of the message
    first_byte: int
    chunk_size: int

    def whole(self, count: int, itemsize: int) -> bool:
        """Whether every chunk that holds an array of `count` elements of `itemsize` bytes at
        `first_byte` arrived."""
        nbytes = count * itemsize
        if nbytes == 0:
            return True
        first, last = self.first_byte // self.chunk_size, (self.first_byte + nbytes - 1) // self.chunk_size
        return bool(self.arrived[first:last + 1].all())

    def elements(self, count: int, itemsize: int) -> np.ndarray:
        """Bool per element of an array of `count` elements of `itemsize` bytes at `first_byte`:
        True where its chunk arrived."""
        nbytes = count * itemsize
        if nbytes == 0:
            return np.ones(count, dtype=bool)
        first, last = self.first_byte // self.chunk_size, (self.first_byte + nbytes - 1) // self.chunk_size
        # Chunk boundaries fall on 8-byte boundaries of the segment, so on element boundaries.
        cuts = np.arange(first + 1, last + 1, dtype=np.int64) * self.chunk_size - self.first_byte
        sizes = np.diff(np.concatenate(([0], cuts, [nbytes]))) // itemsize
        return np.repeat(self.arrived[first:last + 1], sizes)


class Reason(IntEnum):
    """Why a message was handed over."""

    COMPLETE = 0  # every chunk arrived
    CLOSED = 1    # the sender closed it (Early Close or its deadline)
    EXPIRED = 2   # the sender went silent (it died or left)


@dataclass
class Delivery:
    """One received message.

    arrays: the message's arrays (views of engine memory, writable, valid as long as this object
        or any array is alive); None when the message's layout never arrived.
    mask: per chunk, True where it arrived. `element_mask(i)` gives it per element of array i and
        `fractions` per array. Missing chunks hold zeros until `Channel.fill` puts something there.
    """

    sender: int
    msg_id: int
    arrays: list[np.ndarray] | None
    mask: np.ndarray
    reason: Reason
    source: tuple[str, int]
    fractions: list[float]
    datagrams: int = 0
    # chunk k covers bytes [k*chunk_size - meta_len, (k+1)*chunk_size - meta_len) of the data region
    chunk_size: int = 0
    meta_len: int = 0
    offsets: list[int] = field(default_factory=list)
    _handle: object = field(default=None, repr=False)

    @property
    def complete(self) -> bool:
        return bool(self.mask.all())

    @property
    def delivered(self) -> float:
        """Fraction of the message's chunks that arrived."""
        return float(self.mask.mean()) if self.mask.size else 1.0

    def chunks(self, i: int) -> ChunkMask | None:
        """What arrived of arrays[i], per chunk; None when all of it did."""
        if self.arrays is None:
            raise ValueError("the message's layout never arrived")
        if not self.chunk_size or self.fractions[i] >= 1.0:
            return None
        return ChunkMask(self.mask, self.meta_len + self.offsets[i], self.chunk_size)

    def element_mask(self, i: int) -> np.ndarray:
        """Bool array shaped like arrays[i]: True where the element arrived."""
        if self.arrays is None:
            raise ValueError("the message's layout never arrived")
        a, chunks = self.arrays[i], self.chunks(i)
        if chunks is None:
            return np.ones(a.shape, dtype=bool)
        return chunks.elements(a.size, a.itemsize).reshape(a.shape)
