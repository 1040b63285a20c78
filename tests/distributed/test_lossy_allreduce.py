"""The lossy all-reduce (what the DDP hook runs) under injected datagram loss: what is lost is filled
so that the average (under SUM: n times it) stays unbiased. Four ranks' Collectives over their own
engines, in threads."""
import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from p2plearn.distributed.collectives import Collectives, Links
from p2plearn.transport import Channel

RANKS, ROUNDS, SIZE = 4, 40, 6000
MEAN = 1.0  # each rank's values: MEAN + unit noise, fresh every round (as minibatch gradients)


def run_rounds(drop_prob: float | list[float], bound: float, deadline: float | None, op: str = "avg",
               rounds: int = ROUNDS):
    """Per round: every rank's result and the true average, both divided by RANKS under "sum" (so
    that one test judges both ops); each round's delivered fractions; and every rank's input values.
    `drop_prob`: the share of the data datagrams each rank's engine drops on arrival (one for all, or per rank)."""
    drops = drop_prob if isinstance(drop_prob, list) else [drop_prob] * RANKS
    channels = [Channel(sender_id=r, drop_prob=drops[r], seed=r + 1, max_datagram=1472) for r in range(RANKS)]
    try:
        engines = {r: ch.address for r, ch in enumerate(channels)}
        links = Links([1.25e8] * RANKS, [1.25e8] * RANKS)  # 1 Gbit/s each: pacing as without a topology
        groups = [Collectives(ch, r, RANKS, engines, links, timeout=60.0) for r, ch in enumerate(channels)]
        rng = np.random.default_rng(7)
        results, truths, delivered, inputs = [], [], [], []
        with ThreadPoolExecutor(RANKS) as pool:
            for rnd in range(rounds):
                values = MEAN + rng.standard_normal((RANKS, SIZE)).astype(np.float32)
                inputs.append(values)
                truths.append(values.mean(axis=0))
                work = [values[r].copy() for r in range(RANKS)]
                # two layers with their own bounds: the second (a "bias") exact
                layers = [[w[:SIZE - 100], w[SIZE - 100:]] for w in work]
                records = list(pool.map(lambda r: groups[r].allreduce(rnd, layers[r], op, [bound, 0.0], deadline),
                                        range(RANKS)))
                results.append(np.stack(work) / (RANKS if op == "sum" else 1))
                delivered.append(min(rec.delivered for rec in records))
        return np.stack(results), np.stack(truths), delivered, np.stack(inputs)
    finally:
        for ch in channels:
            ch.close()


@pytest.mark.parametrize("op", ["avg", "sum"])
def test_exact_mode_is_the_average(op: str):
    results, truths, delivered, _ = run_rounds(drop_prob=0.05, bound=0.0, deadline=None, op=op)  # lost ones resent
    assert np.allclose(results, truths[:, None, :], rtol=1e-5, atol=1e-5)
    assert all(d == 1.0 for d in delivered)


@pytest.mark.parametrize("op", ["avg", "sum"])
def test_lost_chunks_leave_the_average_unbiased(op: str):
    results, truths, delivered, _ = run_rounds(drop_prob=0.1, bound=0.3, deadline=2.0, op=op)
    error = results - truths[:, None, :]
    missing = ~np.isclose(error, 0, atol=1e-5)  # elements some rank did not get the true average of
    # the loss was real: a fill with zeros would be off by about MEAN times the missing fraction
    assert missing.mean() > 0.02, missing.mean()
    assert min(delivered) < 1.0
    # every element stays an average of some ranks' values (never a zero) ...
    assert np.all(np.abs(results) < MEAN + 6) and results[missing].mean() > MEAN - 0.2
    # ... and on average over rounds and elements equals the true average: unbiased, where a zero
    # fill would show -MEAN * missing.mean() (< -0.02)
    bias = error.mean()
    assert abs(bias) < 0.2 * MEAN * missing.mean(), (bias, missing.mean())
    # the exact layer (bound 0) arrived whole
    assert np.allclose(error[:, :, SIZE - 100:], 0, atol=1e-5)


@pytest.mark.parametrize("op", ["avg", "sum"])
def test_a_rank_that_hears_nothing_keeps_its_own_values_as_the_estimate(op: str):
    """Nearly every data datagram that reaches rank 0 is dropped: an element whose part does not reach it, in
    either phase, keeps its own value as the estimate of the average (under SUM n times it, the
    estimate of the sum: in the part it aggregated and in the parts it did not get back alike).
    Each element of rank 0's result is the mean of its own value and those of the senders whose
    chunk of it arrived: its own alone where none did, the true average where every one did."""
    results, truths, _, inputs = run_rounds(drop_prob=[0.999, 0.0, 0.0, 0.0], bound=0.99, deadline=0.3, op=op, rounds=3)
    bounded = np.s_[:SIZE - 100]  # the layer with a bound
    mine = results[:, 0, bounded]
    subset_means = [inputs[:, [0, *others], bounded].mean(axis=1)
                    for k in range(RANKS) for others in itertools.combinations(range(1, RANKS), k)]
    assert np.all(np.any([np.isclose(mine, m, rtol=1e-5, atol=1e-5) for m in subset_means], axis=0))
    own = np.isclose(mine, inputs[:, 0, bounded], rtol=1e-6, atol=0)
    # the engine's repair passes get some chunks through within the deadline: measured 0.59 its own
    assert own.mean() > 0.25, own.mean()
    assert not np.allclose(mine, truths[:, bounded], atol=1e-3)
