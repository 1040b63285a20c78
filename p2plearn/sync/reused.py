"""Arrays kept from one round to the next, so that a round allocates none.

A fresh array each round costs its size in pages that the kernel faults in and zeroes every round
(at a model's size, a large share of a round's CPU). `ReusedArrays` hands out arrays that nothing
else holds any more, for the encoder's output (`p2plearn.sync.compress`) and a partitioned round's
scratch (`p2plearn.sync.exchange`).
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np


def _references(kept: list[np.ndarray], i: int) -> int:
    """How many references kept[i] has (this call's own included)."""
    return sys.getrefcount(kept[i])


_ALONE = _references([np.empty(0)], 0)  # what an array that only its list holds counts


class ReusedArrays:
    """Arrays handed out again once nothing but this pool holds them.

    Whoever reads one keeps it alive while reading: a channel until its send is done (`Channel.send`'s
    handle keeps the arrays; its `_inflight` keeps the handle until the next send), a caller while it
    holds the list. So an array no one else references is provably not in use, and writing into it
    is as safe as the freeing that a new array each round meant. What is handed out is a view of the
    first `size` elements of the shortest kept array of the dtype at least that long (partitioned
    rounds cut their parts anew with each view of the links: sizes move by a few percent on shaped
    links, by several times on loopback; a new array gets HEADROOM more). `settle` lets go of the kept arrays not handed out
    since the last `settle` that no one holds: called once per round, what stays is what a round
    uses and what is still in flight, e.g. two sets that alternate behind a channel. Not
    thread-safe: its owner uses it from one thread at a time.
    """

    HEADROOM = 1 / 8

    def __init__(self) -> None:
        self._kept: dict[str, list[np.ndarray]] = {}  # per dtype, least recently handed out first
        self._handed: set[int] = set()  # id() of the kept arrays handed out since `settle`
        self.allocated = 0  # arrays allocated so far: none in a round that reused every one

    def take(self, size: int, dtype: Any) -> np.ndarray:
        """An array of `size` elements of `dtype` that no one else holds (contents undefined)."""
        kept = self._kept.setdefault(np.dtype(dtype).str, [])
        fits = [i for i in range(len(kept)) if kept[i].size >= size and _references(kept, i) == _ALONE]
        if fits:
            kept.append(kept.pop(min(fits, key=lambda i: kept[i].size)))
        else:
            kept.append(np.empty(size + int(size * self.HEADROOM), dtype))
            self.allocated += 1
        self._handed.add(id(kept[-1]))
        return kept[-1][:size]

    def settle(self) -> None:
        """Let go of the kept arrays not handed out since the last call that no one holds."""
        for kept in self._kept.values():
            for i in reversed(range(len(kept))):
                if id(kept[i]) not in self._handed and _references(kept, i) == _ALONE:
                    del kept[i]
        self._handed.clear()
