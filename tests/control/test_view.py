"""The global view's versions (p2plearn.control.view)."""
from dataclasses import replace

import numpy as np

from p2plearn.control import GlobalView


def test_a_view_changes_version_only_when_a_planning_input_moves_materially():
    n = 3
    zeros = {name: np.zeros(n) for name in ("uplink_age", "downlink_age", "uplink_noise", "downlink_noise",
                                            "compute_s", "merge_s", "backlog", "in_flight_bytes", "in_flight_msgs")}
    rates = np.full(n, 100.0)
    view = GlobalView(round=0, uplink=rates, downlink=rates, uplink_target=rates, downlink_target=rates,
                      alive=np.ones(n, dtype=bool), clock=np.zeros(n, dtype=np.int64), message_bytes=np.ones(n),
                      **zeros)
    assert replace(view, uplink=np.array([105.0, 100, 100]), compute_s=np.array([0.004, 0, 0])).plans_like(view)
    assert not replace(view, uplink=np.array([80.0, 100, 100])).plans_like(view)  # a burst
    assert not replace(view, compute_s=np.array([0.05, 0, 0])).plans_like(view)  # a straggler
    assert not replace(view, alive=np.array([True, False, True])).plans_like(view)
    assert replace(view, uplink_age=np.ones(n)).plans_like(view)  # not a planning input


def test_multicast_domains_travel_with_the_view_and_are_a_planning_input():
    n = 3
    zeros = {name: np.zeros(n) for name in ("uplink", "downlink", "uplink_target", "downlink_target", "uplink_age",
                                            "downlink_age", "uplink_noise", "downlink_noise", "compute_s", "merge_s",
                                            "backlog", "in_flight_bytes", "in_flight_msgs", "message_bytes")}
    view = GlobalView(round=0, alive=np.ones(n, dtype=bool), clock=np.zeros(n, dtype=np.int64), **zeros)
    assert view.mcast_domain.tolist() == [-1, -1, -1]  # not given: unicast everywhere
    grouped = replace(view, mcast_domain=np.array([0, 0, -1]))
    assert GlobalView.from_blobs(*grouped.to_blobs()).mcast_domain.tolist() == [0, 0, -1]
    assert not grouped.plans_like(view)
