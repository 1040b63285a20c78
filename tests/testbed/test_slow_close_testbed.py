"""Slow close on shaped links (root, slow): p0 sends one message to p1 and p2, each paced at its
planned rate; p2's downlink is cut to 1 Mbit/s mid-send. With slow_close the send to p2 ends "slow"
by about S x its planned time (and the cut port's queue drained ahead of its CLOSE), not at the
(far later) deadline, and p1 gets every chunk."""
from __future__ import annotations

import contextlib
import math
import time

import numpy as np
import pytest

from p2plearn.transport import Channel, Reason
from testbed_helpers import built_testbed, peer
from tests.netns import inside

pytestmark = [pytest.mark.root, pytest.mark.slow]

MBIT = 100.0
PACE = 4e6          # bytes/s per receiver: two of them fit p0's 100 Mbit/s uplink
DATAGRAM = 1472
CHUNK = (DATAGRAM - 56) & ~7
FACTOR = 3.0        # the untouched flow keeps 2 planned times of slack on a busy host
DEADLINE_S = 20.0
CUT_AFTER_S = 0.3   # into the send: about a third of the planned time
# The cut port's queue: the CLOSE waits behind it, so the send ends up to its drain time (0.26 s at
# 1 Mbit/s) after the close; the default 256 KiB would add 2 s.
CUT_BUFFER_KB = 32


def test_a_downlink_cut_mid_send_ends_slow_near_s_times_planned_not_at_the_deadline():
    made: list[Channel] = []
    with built_testbed([peer(f"p{i}", MBIT, MBIT) for i in range(3)]) as testbed:
        try:
            channels = {}
            for i, name in enumerate(testbed.peers):
                with inside(testbed.namespace(name)):
                    channels[name] = Channel(host=testbed.address(name), port=7000, sender_id=i,
                                             max_datagram=DATAGRAM)
                made.append(channels[name])
            x = np.random.default_rng(0).standard_normal(1_000_000).astype(np.float32)  # 4 MB
            planned = (x.nbytes + math.ceil(x.nbytes / CHUNK) * (56 + 42)) / PACE  # its meta left out
            receivers = [(*channels[name].address, PACE) for name in ("p1", "p2")]
            with inside(testbed.namespace("p0")):  # the path MTU is looked up in the caller's namespace
                handle = channels["p0"].send(1, [x], receivers, deadline=DEADLINE_S, slow_close=FACTOR)
            time.sleep(CUT_AFTER_S)
            testbed.set_rate("p2", down_mbit=1.0, buffer_kb=CUT_BUFFER_KB)
            whole, cut = handle.wait(DEADLINE_S + 10)
            assert whole.result == "exact", whole
            assert cut.result == "slow", cut
            # The projection or the limit closed it; the cut port's queue, and a busy host, on top.
            assert cut.elapsed_s < FACTOR * planned + 2.0 < DEADLINE_S, (cut.elapsed_s, planned)
            assert 0 < cut.ack_rate < PACE  # what it was closed on: far below its pace
            d = channels["p1"].recv(timeout=10)
            np.testing.assert_array_equal(d.arrays[0], x)
            d = channels["p2"].recv(timeout=10)
            assert d.reason == Reason.CLOSED and not d.complete
        finally:
            for ch in made:
                with contextlib.suppress(Exception):
                    ch.close()
