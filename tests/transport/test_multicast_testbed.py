"""IP multicast across the testbed's bridge (root, slow): 8 peers at 100 Mbit/s, p0 sends, p1-p7 receive,
each peer a process in its own namespace (tests/transport/mcast_peer.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2plearn import testbed as netns_testbed
from p2plearn.topology import Topology

pytestmark = [pytest.mark.root, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MBIT = 100
RATE = MBIT * 1e6 / 8 * 0.95  # bytes/s: what the sender paces each receiver (and its uplink) at
PORT, MCAST_PORT = 7000, 7100
RECEIVERS = [f"p{i}" for i in range(1, 8)]
GROUP = "239.77.0.0"  # sender 0's


@pytest.fixture(scope="module")
def testbed():
    nodes = [{"id": f"p{i}", "uplink_mbit": MBIT, "downlink_mbit": MBIT} for i in range(8)]
    with netns_testbed.Testbed(Topology.from_data({"nodes": nodes}), f"mc{os.getpid() % 100000}") as tb:
        yield tb


def _start(tb, peer, *args):
    return tb.run(peer, [sys.executable, "-m", "tests.transport.mcast_peer", *map(str, args)], cwd=ROOT,
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def transfer(tb, mode, megabytes=2.0, bound=0.0, window=0):
    """One message from p0 to p1-p7: the sender's JSON and each receiver's two lines (delivery, close)."""
    receivers = [_start(tb, peer, "recv", PORT, MCAST_PORT, megabytes) for peer in RECEIVERS]
    for proc in receivers:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    sender = _start(tb, "p0", "send", MCAST_PORT, mode, megabytes, bound, RATE, window,
                    *(f"{tb.address(peer)}:{PORT}" for peer in RECEIVERS))
    out, err = sender.communicate(timeout=120)
    assert sender.returncode == 0, err
    got = []
    for proc in receivers:
        out_r, err_r = proc.communicate(timeout=60)
        assert proc.returncode == 0, err_r
        got.append([json.loads(line) for line in out_r.splitlines()])
    return json.loads(out), got


def test_one_send_reaches_seven_receivers_with_one_copy_on_the_uplink(testbed):
    multi, got = transfer(testbed, "multicast")
    assert all(r["result"] == "exact" and r["multicast"] for r in multi["receivers"]), multi
    for delivery, closed in got:
        assert delivery["equal"] == [True, True]
        assert GROUP in closed["joined"] and closed["after_close"] == []  # no group left joined
        assert closed["engine"]["mcast_datagrams_received"] > 0
    size = multi["bytes"]
    assert multi["engine"]["bytes_sent"] < 1.2 * size, multi["engine"]  # ~1 copy, not 7
    uni, got = transfer(testbed, "unicast")  # the same message, same testbed: 7 copies
    assert all(r["result"] == "exact" and not r["multicast"] for r in uni["receivers"]), uni
    assert all(delivery["equal"] == [True, True] for delivery, _ in got)
    assert uni["engine"]["bytes_sent"] > 6.5 * size
    assert multi["seconds"] < 0.4 * uni["seconds"], (multi["seconds"], uni["seconds"])


def test_loss_bounds_hold_per_receiver_under_injected_loss(testbed):
    losses = [0.0, 0.01, 0.02, 0.05, 0.05, 0.1, 0.2]
    try:
        for peer, loss in zip(RECEIVERS, losses):
            testbed.set_loss(peer, loss)
        multi, got = transfer(testbed, "multicast", bound=0.1)
    finally:
        for peer in RECEIVERS:
            testbed.set_loss(peer, 0.0)
    assert all(r["result"] in ("exact", "early_closed") for r in multi["receivers"]), multi
    for delivery, _ in got:
        assert delivery["fractions"][0] >= 0.9 and delivery["equal"][1], delivery
    # the 20%-loss receiver is not the group's pace: the sender's uplink carried well under 2 copies
    assert multi["engine"]["bytes_sent"] < 2 * multi["bytes"], multi["engine"]


@pytest.mark.parametrize("window", [0, 256 << 10])  # the message fits in the window; it does not (stalls)
def test_a_receiver_multicast_does_not_reach_gets_it_by_unicast(testbed, window):
    deaf = ["INPUT", "-d", "224.0.0.0/4", "-j", "DROP"]
    testbed._iptables("p3", "-I", *deaf)
    try:
        multi, got = transfer(testbed, "multicast", window=window)
    finally:
        testbed._iptables("p3", "-D", *deaf)
    assert [r["multicast"] for r in multi["receivers"]] == [peer != "p3" for peer in RECEIVERS], multi
    assert all(r["result"] == "exact" for r in multi["receivers"])
    assert all(delivery["equal"] == [True, True] for delivery, _ in got)
    assert got[RECEIVERS.index("p3")][1]["engine"]["mcast_datagrams_received"] == 0


@pytest.mark.parametrize("mode", ["multicast", "auto"])
def test_training_rounds_put_one_copy_on_each_uplink(mode):
    """4 peers under p2plearn-run --testbed, every peer sending to the 3 others each round: auto
    finds at start-up that the group reaches everyone; each uplink carries ~1 copy, not 3."""
    from p2plearn.bench.rounds import run_config

    result = run_config(str(ROOT / "topology" / "homogeneous-4.json"), "all", 3, 1.0, 4, mode)
    assert result["delivered"] == 1.0
    assert result["uplink_mb"] < 1.3, result  # unicast: 3.1 MB


def test_auto_plans_and_sends_by_unicast_where_the_probe_finds_no_multicast(tmp_path):
    """4 peers under p2plearn-run --testbed, p3 behind a router ("multicast": false), every peer
    sending to the 3 others: the start-up probes make ranks 0-2 one multicast domain and rank 3
    unicast-only, and from the view that says so each of ranks 0-2 puts one copy on its uplink for
    the other two and one for rank 3; rank 3 one for each."""
    from p2plearn.bench.rounds import run_config

    nodes = [{"id": f"p{i}", "uplink_mbit": MBIT, "downlink_mbit": MBIT} for i in range(4)]
    nodes[3]["multicast"] = False
    topology = tmp_path / "mixed-4.json"
    topology.write_text(json.dumps({"nodes": nodes}))
    result = run_config(str(topology), "all", 3, 1.0, 6, "auto")  # the domains apply from round 2 on
    assert result["delivered"] == 1.0
    grouped, unicast_only = result["uplink_mb_per_rank"][:3], result["uplink_mb_per_rank"][3]
    assert all(1.9 < mb < 2.4 for mb in grouped), result  # 2 copies of 1.04 MB (unicast: 3)
    assert unicast_only > 3.0, result
