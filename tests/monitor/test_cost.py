"""The dashboard costs the coordinator little: 64 simulated members report rounds as fast as they can
while a poller reads the page's JSON, /metrics and the page itself as often as ten open pages would;
the coordinator handles the reports at nearly the rate it does without a dashboard.

Run with ``-s`` to see the numbers."""

import secrets
import subprocess
import sys
import time

import pytest

from p2plearn.control import Coordinator
from p2plearn.control.table import MembershipTable
from p2plearn.monitor import attach
from p2plearn.monitor.page import POLL_MS

from monitor_helpers import JOB, RawMembers, wait_state

MEMBERS = 64
ROUNDS = 30
PAGES = 10  # open pages, each polling every POLL_MS: a poller without pause would measure the 2 cores
POLLER = """
import sys, time, urllib.request
base, pause = sys.argv[1], float(sys.argv[2])
while True:
    for path in ("/api/state", "/metrics", "/"):
        urllib.request.urlopen(base + path, timeout=5).read()
        time.sleep(pause)
"""


def reports_per_second(dashboard: bool) -> float:
    key = secrets.token_hex(32)
    coordinator = Coordinator(JOB, key, world_size=MEMBERS, heartbeat=0.1)  # ticks (snapshots) 10 per second
    served = attach(coordinator, "127.0.0.1:0", key) if dashboard else None
    coordinator.start()
    members = RawMembers(coordinator.address, key, MEMBERS)
    poller = None
    try:
        if served is not None:
            wait_state(served, lambda s: len(s["peers"]) == MEMBERS, 10, "every member")
            poller = subprocess.Popen([sys.executable, "-c", POLLER, f"http://127.0.0.1:{served.port}",
                                       str(POLL_MS / 1000 / PAGES)])
            time.sleep(0.5)
        start = time.perf_counter()
        for clock in range(1, ROUNDS + 1):
            for rank in range(MEMBERS):
                members.report(rank, clock, loss=1.0 / clock)
        for rank in range(MEMBERS):  # answered after the rank's reports (one connection keeps its order)
            members.request(rank, {"type": "members"})
        return ROUNDS * MEMBERS / (time.perf_counter() - start)
    finally:
        if poller is not None:
            poller.kill()
            poller.wait()
        members.close()
        coordinator.stop()
        if served is not None:
            served.stop()


@pytest.mark.slow
def test_the_dashboard_does_not_slow_the_coordinator():
    runs = [(reports_per_second(False), reports_per_second(True)) for _ in range(2)]  # interleaved: load drifts
    without, with_page = (max(r) for r in zip(*runs))
    print(f"\n{MEMBERS} members: {without:.0f} reports/s without a dashboard, {with_page:.0f} with {PAGES} pages "
          f"polling ({with_page / without:.0%})")
    # Loose: the machine running the tests is shared; the numbers printed are the measurement.
    assert with_page > 0.5 * without


def test_a_snapshot_of_64_members_is_cheap():
    table = MembershipTable(MEMBERS)
    for rank in range(MEMBERS):
        table.register(rank, f"s{rank}", join=False, host="sim", engine=("127.0.0.1", 20000 + rank), standby=None,
                       clock=0, resume=None, link_rate=None)
    for rank in range(MEMBERS):
        table.report(rank, f"s{rank}", clock=1, loss=1.0, step_time=0.02, message_bytes=4096.0,
                     links={(rank + 1) % MEMBERS: {"rate": 1e6, "paced": 1e6, "probe": "", "multicast": False}},
                     load={})
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        table.watch(time.monotonic())
    per_snapshot = (time.perf_counter() - start) / n
    print(f"\none snapshot of {MEMBERS} members: {per_snapshot * 1e6:.0f} us (taken once per coordinator tick)")
    assert per_snapshot < 0.01  # a tick is 0.5 s by default: far below 2% of it
