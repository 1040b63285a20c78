"""Training's merge rule waited in virtual time (`sim.window`), and co-located peers (`sim.hosts`)."""
from __future__ import annotations

import numpy as np
import pytest

from p2plearn.sim.hosts import Hosts
from p2plearn.sim.window import VirtualWindow
from p2plearn.sync.window import GRACE_S, LATE_SENDER, MergeWindow


def flows(dst, arrival, rnd=0):
    return {"round": np.full(len(dst), float(rnd)), "dst": np.array(dst, float), "arrival": np.array(arrival, float)}


def test_bsp_gives_up_on_a_sender_past_its_wait_limit_and_drops_its_message():
    window = VirtualWindow(2, MergeWindow())
    late = LATE_SENDER * 0.1 + GRACE_S + 1.0  # past peer 0's limit with a 0.1 s deadline
    f = flows([0, 1], [late, 0.2])
    merge_at = window.round(0, np.zeros(2), np.full(2, 0.1), f, 0.1, 0.05)
    assert merge_at.tolist() == [LATE_SENDER * 0.1 + GRACE_S, 0.2]
    taken, gone = window.taken(0, merge_at, f)
    assert taken.tolist() == [False, True] and gone.all()


def test_bsp_waits_for_every_sender_within_the_limit_and_its_own_sends():
    window = VirtualWindow(2, MergeWindow())
    f = flows([0, 1], [5.0, 0.2])  # no deadline and no typical rounds yet: the cap
    assert window.round(0, np.zeros(2), np.array([0.1, 0.3]), f, None, 0.05).tolist() == [5.0, 0.3]


def test_ssp_merges_when_the_slowest_peer_finished_round_r_minus_s_and_fails_past_the_cap():
    window = VirtualWindow(2, MergeWindow(1, ssp=True, round_cap_s=10.0))
    assert window.round(0, np.zeros(2), np.array([0.1, 4.0]), flows([], []), None, 0.05).tolist() == [0.1, 4.0]
    merge_at = window.round(1, np.array([0.2, 4.1]), np.array([0.3, 20.0]), flows([], [], 1), None, 0.05)
    assert merge_at.tolist() == [4.0, 20.0]  # peer 0 waited for peer 1's round 0
    taken, gone = window.taken(1, merge_at, flows([0, 0, 1], [3.0, 5.0, 4.1], 1))
    assert taken.tolist() == [True, False, True] and gone.tolist() == [True, False, True]
    with pytest.raises(TimeoutError, match="slowest live peer stayed below clock 2"):  # 20 - 4.5 s > the cap
        window.round(2, np.array([4.1, 20.1]), np.array([4.5, 20.2]), flows([], [], 2), None, 0.05)


def test_peers_sharing_a_hosts_cores_take_longer_and_pay_the_engine_to_receive():
    own = Hosts(engine_s_per_byte=1e-9, round_cpu_s=0.005)
    assert own.stretch(16).tolist() == [1.0] * 16 and own.receive_s(0.01, 4e6, 1e6) == 0.01
    assert own.round_s(16).tolist() == [0.0] * 16
    shared = Hosts(cores=2, hosts=2, engine_s_per_byte=1e-9, round_cpu_s=0.005)
    assert shared.stretch(16).tolist() == [4.0] * 16  # 8 peers on each host's 2 cores
    assert shared.round_s(16).tolist() == [0.02] * 16
    assert shared.stretch(3).tolist() == [1.0, 1.0, 1.0]
    assert shared.receive_s(0.01, 4e6, 1e6) == pytest.approx(0.04 + 4e-3)
    with pytest.raises(ValueError, match="at least one host"):
        Hosts(cores=2, hosts=0)


def test_a_paced_round_costs_a_colocated_peer_its_engines_cpu_for_as_long_as_its_flows_last():
    send_s, received_s = np.array([0.5, 0.0, 0.2]), np.array([1.0, 2.0, 0.0])  # peer 1 sent nothing
    assert Hosts(pacing_s_per_s=(0.04, 0.03)).pacing_s(send_s, received_s).tolist() == [0.0] * 3  # cores of its own
    shared = Hosts(cores=2, pacing_s_per_s=(0.04, 0.03))
    assert shared.pacing_s(send_s, received_s) == pytest.approx([0.02 + 0.03, 0.06, 0.008])
    assert "pacing (0.040 s/s sending, 0.030 s/s per flow received)" in shared.describe(3)
