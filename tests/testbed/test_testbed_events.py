"""Topology events change a link at their time and end on time (root only)."""

import pytest

from p2plearn.testbed.probe import median_rate, tcp_transfer
from p2plearn.testbed.scheduler import timeline
from p2plearn.topology import Topology
from testbed_helpers import built_testbed, measure_until, on, peer

BASE_MBIT = 200.0
EVENT_MBIT = 40.0
EVENT_AT_S = 4.0  # probes start in ~0.5 s on a quiet host, seconds on a busy one: time to see the link before
EVENT_FOR_S = 1.5
SETTLE_S = 0.25  # a rate change takes this long to show in TCP's throughput (queue drains)


@pytest.mark.root
def test_rate_drop_takes_effect_and_ends_on_time():
    event = {"at_s": EVENT_AT_S, "duration_s": EVENT_FOR_S, "downlink_mbit": EVENT_MBIT}
    nodes = [peer("p0", 1000, 1000), peer("p1", 1000, BASE_MBIT, events=[event])]
    end = EVENT_AT_S + EVENT_FOR_S

    def measure():
        with built_testbed(nodes) as testbed:
            transfer = tcp_transfer(on(testbed, "p0"), on(testbed, "p1"), testbed.address("p1"), seconds=end + 1.3)
            t0 = testbed.started_at
        # A probe that waited for a core may start after t0 + 0.8: measure "before" from its start.
        start = max(t0 + 0.8, transfer["samples"][0][0] + 0.2)
        if start > t0 + EVENT_AT_S - 0.3:
            return None, None, None  # it started too late to see the link before the event
        before = median_rate(transfer["samples"], start, t0 + EVENT_AT_S - 0.05)
        during = median_rate(transfer["samples"], t0 + EVENT_AT_S + SETTLE_S, t0 + end - 0.05)
        after = median_rate(transfer["samples"], t0 + end + SETTLE_S, t0 + end + 1.0)
        return before / BASE_MBIT, during / EVENT_MBIT, after / BASE_MBIT

    def on_time(ratios):
        before, during, after = ratios
        return before is not None and 0.80 <= before <= 1.03 and 0.80 <= during <= 1.10 and 0.80 <= after <= 1.03

    results = measure_until(measure, on_time)
    assert on_time(results[-1]), results
    assert all(r[1] <= 1.10 for r in results if r[0] is not None), results  # the drop never fails to bind


def test_timeline_orders_changes_and_restores_base_values():
    nodes = [
        peer("a", 100, 100, loss=0.01,
             events=[{"at_s": 1, "duration_s": 0.5, "every_s": 3, "until_s": 5, "loss": 0.2}]),
        peer("b", 50, 50, events=[{"at_s": 2, "duration_s": 1, "uplink_mbit": 5}]),
    ]
    changes = list(timeline(Topology.from_data({"nodes": nodes})))
    assert changes == [
        (1.0, "a", {"loss": 0.2}),
        (1.5, "a", {"loss": 0.01}),
        (2.0, "b", {"uplink_mbit": 5.0}),
        (3.0, "b", {"uplink_mbit": 50.0}),
        (4.0, "a", {"loss": 0.2}),
        (4.5, "a", {"loss": 0.01}),
    ]
