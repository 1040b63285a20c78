"""Streaming rounds: the exchanged arrays split into fragments, one fragment per round.

With ``--fragments F`` the arrays a round exchanges are cut, in model order, into F consecutive
groups of whole arrays whose largest holds as few bytes as any such cut allows. The optimizer
first cuts its buckets (`p2plearn.train.buckets`) where the running total of bytes crosses each
F-th of the model (`fragment_pieces`), so the fragments come out equal to an element, whatever
the sizes of the tensors: a tensor larger than a share (an MLP's hidden matrix, an embedding)
is split between fragments. Round r carries fragment ``r mod F`` only, and rounds run every
H/F local steps: each fragment is averaged every H steps, fragment f at offset f*H/F of the
period, and a round's message (the peak on each uplink) is about 1/F of the model. Which fragment a
round carries follows from the round clock alone, so every peer agrees on it, joiners, rejoiners
and resumed peers too.

`Fragments` itself groups whole arrays, so it needs at least F of them.
"""
from __future__ import annotations


def fragment_pieces(nbytes: list[int], itemsizes: list[int], count: int) -> list[tuple[int, int, int]]:
    """Arrays of `nbytes` bytes (elements of `itemsizes` bytes), in order, cut where the running
    total crosses k/`count` of all bytes (k = 1..count-1), at the element there: (array, first
    element, end element) per piece, in order. Arrays no cut crosses stay whole; `count` 1 cuts
    nothing. Fragments of whole pieces can then be equal to an element."""
    total = sum(nbytes)
    targets = [k * total // count for k in range(1, count)]
    pieces, offset = [], 0
    for a, (size, item) in enumerate(zip(nbytes, itemsizes)):
        end = size // item
        cuts = sorted({(t - offset) // item for t in targets if offset < t < offset + size} - {0, end})
        bounds = [0, *cuts, end]
        pieces += [(a, lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
        offset += size
    return pieces


def balanced_cuts(sizes: list[int], count: int) -> list[int]:
    """Where to cut `sizes` (bytes per array, in order; at least `count` of them) into `count`
    non-empty consecutive groups so that the largest group's total is as small as it can be;
    returns the first index of each group. The smallest such bound is found by bisection (a greedy
    pass tells whether a bound fits in `count` groups), then each group is filled up to it, in
    order: O(n log(total bytes)), deterministic."""
    def groups_within(cap: int) -> int:
        groups, filled = 1, 0
        for s in sizes:
            if filled + s > cap:
                groups, filled = groups + 1, 0
            filled += s
        return groups

    low, high = max(sizes), sum(sizes)
    while low < high:
        middle = (low + high) // 2
        if groups_within(middle) <= count:
            high = middle
        else:
            low = middle + 1
    starts, filled = [0], sizes[0]
    for i in range(1, len(sizes)):
        # a new group where the bound is reached, or where each array left needs a group of its own
        if filled + sizes[i] > low or len(sizes) - i == count - len(starts):
            starts.append(i)
            filled = 0
        filled += sizes[i]
    return starts


class Fragments:
    """Which arrays each round carries.

    Args:
        nbytes: bytes of each exchanged array, in model order.
        count: F, the number of fragments (1: every round carries every array, as without fragments).

    `arrays(rnd)` is the indices of the arrays round `rnd` carries; `groups[f]` those of fragment f.
    """

    def __init__(self, nbytes: list[int], count: int = 1):
        if count < 1:
            raise ValueError(f"--fragments must be >= 1, got {count}")
        if count > len(nbytes):
            total_mib = sum(nbytes) / 2**20
            raise ValueError(f"--fragments {count}: {len(nbytes)} array(s) of {total_mib:.3g} MiB in all, and a "
                             f"fragment is made of whole arrays: at most {len(nbytes)} fragments")
        self.count = count
        cuts = balanced_cuts(nbytes, count) + [len(nbytes)]
        self.groups = [list(range(a, b)) for a, b in zip(cuts[:-1], cuts[1:])]
        self.nbytes = [sum(nbytes[i] for i in group) for group in self.groups]

    def of_round(self, rnd: int) -> int:
        """The fragment round `rnd` carries."""
        return rnd % self.count

    def arrays(self, rnd: int) -> list[int]:
        """The indices of the arrays round `rnd` carries."""
        return self.groups[self.of_round(rnd)]
