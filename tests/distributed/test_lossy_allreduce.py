"""The lossy all-reduce (what the DDP hook runs) under injected datagram loss: what is lost is filled
so that the average stays unbiased. Four ranks' Collectives over their own engines, in threads."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from p2plearn.distributed.collectives import Collectives, Links
from p2plearn.transport import Channel

RANKS, ROUNDS, SIZE = 4, 40, 6000
MEAN = 1.0  # each rank's values: MEAN + unit noise, fresh every round (as minibatch gradients)


def run_rounds(drop_prob: float, bound: float, deadline: float | None):
    """Per round: every rank's result and the true average; and each round's delivered fractions."""
    channels = [Channel(sender_id=r, drop_prob=drop_prob, seed=r + 1, max_datagram=1472) for r in range(RANKS)]
    try:
        engines = {r: ch.address for r, ch in enumerate(channels)}
        links = Links([1.25e8] * RANKS, [1.25e8] * RANKS)  # 1 Gbit/s each: pacing as without a topology
        groups = [Collectives(ch, r, RANKS, engines, links, timeout=60.0) for r, ch in enumerate(channels)]
        rng = np.random.default_rng(7)
        results, truths, delivered = [], [], []
        with ThreadPoolExecutor(RANKS) as pool:
            for rnd in range(ROUNDS):
                values = MEAN + rng.standard_normal((RANKS, SIZE)).astype(np.float32)
                truths.append(values.mean(axis=0))
                work = [values[r].copy() for r in range(RANKS)]
                # two layers with their own bounds: the second (a "bias") exact
                layers = [[w[:SIZE - 100], w[SIZE - 100:]] for w in work]
                records = list(pool.map(lambda r: groups[r].allreduce(rnd, layers[r], "avg", [bound, 0.0], deadline),
                                        range(RANKS)))
                results.append(np.stack(work))
                delivered.append(min(rec.delivered for rec in records))
        return np.stack(results), np.stack(truths), delivered
    finally:
        for ch in channels:
            ch.close()


def test_exact_mode_is_the_average():
    results, truths, delivered = run_rounds(drop_prob=0.05, bound=0.0, deadline=None)  # lost datagrams resent
    assert np.allclose(results, truths[:, None, :], rtol=1e-5, atol=1e-5)
    assert all(d == 1.0 for d in delivered)


def test_lost_chunks_leave_the_average_unbiased():
    results, truths, delivered = run_rounds(drop_prob=0.1, bound=0.3, deadline=2.0)
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
