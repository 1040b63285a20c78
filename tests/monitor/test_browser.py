"""A real 4-peer job's page in a real headless browser (Debian's chromium): what it renders, a killed
peer marked dead, and the page back from the successor after the coordinator is killed."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "faults"))
from faults_helpers import Job  # noqa: E402 - the fault tests' job of trainer.py peers, started as torchrun does

CHROMIUM = shutil.which("chromium")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium)")]


def rendered(url: str) -> str:
    """The page's DOM once its script ran."""
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=2000",
                          "--dump-dom", url], capture_output=True, text=True, timeout=60)
    return out.stdout


def peers(dom: str) -> dict[int, str]:
    return {int(r): s for r, s in re.findall(r'<tr data-rank="(\d+)" data-state="(\w+)">', dom)}


def edges(dom: str) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in re.findall(r'class="edge" data-src="(\d+)" data-dst="(\d+)"', dom)}


def curves(dom: str) -> dict[int, int]:
    return {int(r): int(n) for r, n in re.findall(r'class="curve" data-rank="(\d+)" data-points="(\d+)"', dom)}


def wait_page(url: str, condition, timeout: float, what: str) -> str:
    deadline, dom = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        dom = rendered(url)
        if condition(dom):
            return dom
        time.sleep(0.5)
    raise AssertionError(f"the page never showed {what} within {timeout:g} s; it showed peers {peers(dom)}, "
                         f"edges {sorted(edges(dom))}, curves {curves(dom)}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_page_of_a_job_in_a_browser(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    job = Job(4, str(tmp_path), seconds=120, env={"P2PLEARN_DASHBOARD": f"127.0.0.1:{port}"})
    try:
        job.wait_ready()
        job.wait_line(0, f"p2plearn dashboard of job {job.job_id} (term 0): {url}", 10)  # said once, at start
        dom = wait_page(url, lambda d: list(peers(d).values()) == ["alive"] * 4 and len(edges(d)) >= 4
                        and len(curves(d)) == 4 and min(curves(d).values()) >= 2, 60, "4 live peers, flows, curves")
        assert all(a != b and {a, b} <= {0, 1, 2, 3} for a, b in edges(dom))
        first = curves(dom)
        wait_page(url, lambda d: all(curves(d).get(r, 0) > first[r] for r in first), 30, "curves that grow")

        os.kill(job.ready[3][0], signal.SIGKILL)
        wait_page(url, lambda d: peers(d).get(3) == "dead" and list(peers(d).values()).count("alive") == 3,
                  30, "rank 3 dead")

        killed = time.monotonic()
        os.kill(job.coordinator_pid, signal.SIGKILL)
        dom = wait_page(url, lambda d: "term 1" in d and sorted(r for r, s in peers(d).items() if s == "alive")
                        == [0, 1, 2], 60, "the successor's page")
        print(f"\nthe page came back from the successor {time.monotonic() - killed:.1f} s after the kill")
        wait_page(url, lambda d: len(curves(d)) == 3 and len(edges(d)) >= 3, 30, "the successor's flows and curves")
    finally:
        job.close()
