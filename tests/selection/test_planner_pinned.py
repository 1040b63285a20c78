"""The C planner's exact output (p2p_plan_make), pinned: receivers in the order it writes them, T to
the last bit and its error messages, on views that reach every step and constraint it has.

The planner is deterministic, and every peer must compute the same plan from the same view: a
change to native/planner*.c that moves any of these is a change of behaviour, not a refactor. When
a change of behaviour is meant, regenerate the pins (print `_digest()` and the literal plans) and
say why in the commit.
"""
from __future__ import annotations

import hashlib

import numpy as np

from p2plearn.compute import ffi, lib

_U64 = (1 << 64) - 1


def raw_plan(up, down, size, alive, p, up_start=None, down_start=None, merge_cost=None, domain=None,
             max_fanout=0, max_fanin=0, mixing_slack=0.0, seed=0, round=0):
    """(rc, T as float.hex, receivers per peer in the C order), or (rc, error message) on failure."""
    n = len(up)
    zeros = np.zeros(n)
    keep = [np.ascontiguousarray(a, dtype=np.float64)   # the buffers outlive the call that reads them
            for a in (up, down, size, zeros if up_start is None else up_start,
                      zeros if down_start is None else down_start)]
    c = {name: ffi.from_buffer("double[]", a)
         for name, a in zip(("uplink", "downlink", "message_bytes", "up_start", "down_start"), keep)}
    extra = []
    if merge_cost is not None:
        extra.append(np.ascontiguousarray(merge_cost, dtype=np.float64))
        c["merge_cost"] = ffi.from_buffer("double[]", extra[-1])
    if domain is not None:
        extra.append(np.ascontiguousarray(domain, dtype=np.int32))
        c["mcast_domain"] = ffi.from_buffer("int32_t[]", extra[-1])
    alive_buf = np.ascontiguousarray(alive, dtype=np.uint8)
    c_view = ffi.new("p2p_view *", dict(c, n=n, alive=ffi.from_buffer("uint8_t[]", alive_buf)))
    out = ffi.new("p2p_plan *")
    rc = lib.p2p_plan_make(c_view, p, max_fanout, max_fanin, mixing_slack, seed & _U64, round & _U64, out)
    if rc < 0:
        return rc, ffi.string(lib.p2p_last_error()).decode()
    try:
        offsets = [out.offsets[i] for i in range(n + 1)]
        receivers = [out.receivers[k] for k in range(offsets[-1])]
        return rc, out.time.hex(), [receivers[offsets[i]:offsets[i + 1]] for i in range(n)]
    finally:
        lib.p2p_plan_free(out)


def _instances():
    """Views from 2 to 1,100 peers: equal and unequal sizes, dead peers, start times, merge costs (with
    zeros), multicast domains, fan-out and fan-in caps, starved downlinks with and without mixing
    slack, p from 0 past live - 1; then bad arguments, for their messages."""
    rng = np.random.default_rng(42)
    sizes_n = [2, 3, 4, 5, 6, 7, 8, 12, 20, 40, 64, 65, 100, 300]
    for k in range(160):
        n = sizes_n[k % len(sizes_n)]
        down = rng.choice([1.0, 2, 5, 10, 20], n) * rng.uniform(0.8, 1.2, n) * 1e6
        up = down * (rng.uniform(0.5, 4.0, n) if k % 4 >= 2 else rng.uniform(0.2, 1.0, n))
        size = np.full(n, 1e6) if k % 2 == 0 else rng.uniform(0.3, 3.0, n) * 1e6
        alive = rng.random(n) >= (0.2 if k % 3 == 0 else 0.0)
        if k % 7 == 3:
            down[rng.integers(0, n)] *= 1e-3   # a peer whose downlink may take no message by T
        kw = dict(p=int(rng.integers(0, 6)), seed=int(rng.integers(0, 1 << 63)) * 3, round=k * 1000003)
        if k % 5 >= 3:
            kw.update(up_start=rng.uniform(0, 2, n), down_start=rng.uniform(0, 1, n))
        if k % 6 >= 4:
            kw["merge_cost"] = np.where(rng.random(n) < 0.3, 0.0, rng.uniform(1e-3, 0.2, n))
        if k % 8 >= 5:
            kw["domain"] = rng.integers(-1, 3, n)
        if k % 9 >= 6:
            kw["max_fanout"] = kw["p"] + int(rng.integers(0, 3))
        if k % 10 >= 7:
            kw["max_fanin"] = max(kw["p"], 1) + int(rng.integers(0, 2))
        if k % 7 == 3 and k % 2:
            kw["mixing_slack"] = 0.5
        yield (up, down, size, alive), kw
    n = 1100   # above PASS_BUDGET / MIN_PASSES peers: the fewest passes per T
    down = rng.choice([1.0, 5, 20], n) * 1e6
    yield (down * 0.5, down, rng.uniform(0.3, 3.0, n) * 1e6, np.ones(n, bool)), dict(p=3, seed=9, round=1)
    ones, live = np.ones(4), np.ones(4, bool)
    for kw in (dict(p=-1), dict(p=2, max_fanout=1), dict(p=2, max_fanin=1), dict(p=1, mixing_slack=-1.0),
               dict(p=1, up_start=[0, 0, 2e6, 0]), dict(p=1, merge_cost=[0, -1.0, 0, 0]),
               dict(p=1, domain=[0, -2, 0, 0])):
        yield (ones, ones, ones, live), kw
    yield (ones, [1, 0, 1, 1], ones, live), dict(p=1)
    yield (ones, ones, [1, np.inf, 1, 1], live), dict(p=1)
    yield (np.full(4, 1e-300), ones, np.full(4, 1e300), live), dict(p=2)   # a round of about 1e600 s


def _digest() -> str:
    h = hashlib.sha256()
    for arrays, kw in _instances():
        h.update(repr(raw_plan(*arrays, **kw)).encode())
    return h.hexdigest()


def test_plans_are_bit_identical_to_the_pinned_ones():
    assert _digest() == "95498960eb82e862a5581fdcf9c24de20ed736c26bb73f88e346537d9fb7387e"


def test_literal_plans():
    # equal sizes, unicast, one dead peer
    assert raw_plan([1e6, 2e6, 1e6, 3e6, 1e6], [4e6, 4e6, 1e6, 8e6, 2e6], [1e6] * 5, [1, 1, 1, 0, 1], 2,
                    seed=7, round=3) == (0, '0x1.0000000000000p+1', [[1, 4], [0, 4, 2], [1, 0], [], [1, 0]])
    # unequal sizes, mixed multicast domains, start times and merge costs, capped fan-in
    plan = raw_plan([1e6, 1e6, 2e6, 1e6, 4e6, 1e6], [5e6, 3e6, 5e6, 2e6, 9e6, 4e6],
                    [1e6, 2e6, 0.5e6, 1e6, 3e6, 1.5e6], [1] * 6, 2, up_start=[0, 0.1, 0, 0.5, 0, 0.2],
                    down_start=[0.3, 0, 0, 0, 0.1, 0], merge_cost=[0.01, 0, 0.02, 0.05, 0, 0.01],
                    domain=[0, 0, 0, -1, 1, 1], max_fanin=3, seed=11, round=2)
    assert plan == (0, '0x1.999999999999ap+1', [[3, 2, 1], [2, 0], [3, 1, 4, 0, 5], [4, 5], [0, 5, 3, 2], [4, 1]])
    # a starved downlink: a sender only with mixing slack
    assert raw_plan([1e6] * 5, [8e6, 8e6, 8e6, 8e6, 0.9e6], [1e6] * 5, [1] * 5, 1, mixing_slack=0.2,
                    seed=1, round=0) == (0, '0x1.1c71c71c71c72p+0', [[2], [0], [3], [4], [1]])
