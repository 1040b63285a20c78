"""Partitioned rounds with the slow close, through real engines: parts are small messages whose
planned time is shorter than the pacer's first wake-up, and a slow close must still leave each
receiver a message to merge, not a round that waits out its limit."""
from __future__ import annotations

import secrets

import numpy as np

from p2plearn.control import Coordinator
from p2plearn.sync.partitioned import Partitioned
from tests.sync.test_rounds import JOB, Peer, run_threads

RATE = 20e6      # bytes/s each way: a 4 KB part is planned at 0.2 ms, below the pacer's first wake (~0.8 ms)
ROUND_CAP_S = 5.0  # a phase waits this long at most, before its peers have typical rounds


def test_partitioned_rounds_with_the_slow_close_merge_every_part_without_waiting_out_their_limit():
    key = secrets.token_hex(16)
    coord = Coordinator(JOB, key, heartbeat=0.2, startup_grace=1.0,
                        rates={0: (RATE, RATE), 1: (RATE, RATE)}).start()
    peers = []
    try:
        for rank in (0, 1):
            peers.append(Peer(rank, coord, key, Partitioned, params=[np.full(2048, float(rank), np.float32)],
                              slow_close=2.0, round_cap_s=ROUND_CAP_S))
        for p in peers:
            p.client.wait_members(2, 5.0, receiving=True)
        stats = []
        run_threads(peers, 3, after_step=stats.append)
        assert all(st.planned_s < 0.01 for st in stats)  # paced, so the slow close applies
        # each round ends on its messages, not on its limit (a stalled one takes 2 x ROUND_CAP_S)
        assert all(st.comm_s < ROUND_CAP_S / 2 for st in stats), [st.comm_s for st in stats]
        for p in peers:  # every part came in both phases: the full average, 0.5
            np.testing.assert_array_equal(p.params[0], 0.5)
    finally:
        for p in peers:
            p.close()
        coord.stop()
