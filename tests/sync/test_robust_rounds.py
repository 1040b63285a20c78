"""BSP rounds through the robust merge (Synchronizer._merge), with real engines and control plane."""
from __future__ import annotations

import numpy as np

from p2plearn.sync import BSP
from p2plearn.sync.robust import RobustMerge
from tests.sync import test_rounds
from tests.sync.test_rounds import run_threads

job = test_rounds.job  # the fixture: peers of an in-process job, closed after the test


def params(rank: int) -> list[np.ndarray]:
    """Rank 3 lies in the first array (1000 where the others hold their rank), not in the second."""
    return [np.full((50, 40), 1000.0 if rank == 3 else float(rank), np.float32), np.full(7, 10.0 * rank, np.float32)]


def test_a_bsp_round_clips_the_liar_and_merges_the_rest(job):
    peers = job(4, BSP, params=params, robust=RobustMerge("clip"))
    assert all(isinstance(p.sync.robust, RobustMerge) for p in peers)
    for p in peers:  # each receiver its own record (the fixture passed them one)
        p.sync.robust = RobustMerge("clip")
    run_threads(peers, 1)
    # rank 0 sees distances 1, 2 and 1000 in the first array: the typical one is 2 (the lower median),
    # so rank 3, past the radius 2 x 2, counts as 2 and rank 0 becomes 0 + (1 + 2 + 2) / 4; in the
    # second (10, 20, 30) nobody is cut
    np.testing.assert_allclose(peers[0].params[0], 1.25, rtol=1e-6)
    np.testing.assert_allclose(peers[0].params[1], 15.0, rtol=1e-6)
    np.testing.assert_allclose(peers[1].params[0], 1.25, rtol=1e-6)  # distances -1, 1, 999: typical 1
    stats = peers[0].sync.robust.stats()["senders"]
    assert stats[3] == {"merges": 2, "clipped": 1, "cut": stats[3]["cut"]} and 0.49 < stats[3]["cut"] < 0.5
    assert stats[1]["clipped"] == stats[2]["clipped"] == 0


def test_without_robust_the_liar_drags_the_round(job):
    peers = job(4, BSP, params=params)
    run_threads(peers, 1)
    np.testing.assert_allclose(peers[0].params[0], (0 + 1 + 2 + 1000) / 4, rtol=1e-6)
    assert peers[0].sync.robust is None
