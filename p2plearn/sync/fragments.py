"""Streaming rounds: the exchanged arrays split into fragments, one fragment per round.

With ``--fragments F`` the arrays a round exchanges (the buckets of `p2plearn.train.buckets`)
are cut, in model order, into F consecutive groups of whole arrays whose largest holds as few
bytes as any such cut allows. Round r carries fragment ``r mod F`` only, and rounds run every
H/F local steps: each fragment is averaged every H steps, fragment f at offset f*H/F of the
period, and a round's message (the peak on each uplink) is about 1/F of the model. Which fragment a
round carries follows from the round clock alone, so every peer agrees on it, joiners, rejoiners
and resumed peers too.

A fragment is made of whole arrays, so a model needs at least F of them: with fewer (a small
model in one 25 MiB bucket), lower ``--bucket-mb`` (`Fragments` names the value to try).
"""
from __future__ import annotations


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
            raise ValueError(f"--fragments {count}: the model is exchanged in {len(nbytes)} array(s) (buckets) and a "
                             f"fragment is made of whole ones; lower --bucket-mb to make at least {count} "
                             f"(e.g. --bucket-mb {total_mib / (2 * count):.3g} for this {total_mib:.3g} MiB model)")
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
