"""The live page's timeline, rendered by a real headless browser: a compute and a communication bar per
reported round of each peer."""

import re
import shutil
import subprocess

import pytest

from monitor_helpers import monitored, wait_state

CHROMIUM = shutil.which("chromium")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium)")
def test_the_timeline_shows_each_peers_last_rounds():
    with monitored(3) as (dashboard, members):
        for clock in range(1, 5):
            for rank in range(3 if clock < 4 else 2):  # rank 2 reports 3 rounds, the others 4
                members.report(rank, clock, loss=1.0 / clock)
        wait_state(dashboard, lambda s: [len(s["timeline"].get(str(r), [])) for r in range(3)] == [4, 4, 3], 5,
                   "the rounds in the timeline")
        dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=2000",
                              "--dump-dom", f"http://127.0.0.1:{dashboard.port}/"],
                             capture_output=True, text=True, timeout=60).stdout
        for kind in ("compute", "comm"):
            bars = re.findall(rf'<rect class="{kind}" data-rank="(\d+)" data-round="(\d+)"', dom)
            assert sorted(bars) == sorted([(str(r), str(c)) for r in range(3) for c in range(1, 5) if (r, c) != (2, 4)])
