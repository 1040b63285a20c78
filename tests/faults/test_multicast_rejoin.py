"""A peer that restarts under ``--transport-mode auto`` shares the multicast domain again: the others
probe its new engine (a start-up probe alone left it unicast-only for the rest of the job)."""

import os
import signal
import subprocess
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.root]


@pytest.fixture
def multicast_netns():
    """A network namespace whose loopback carries IP multicast; deleted after the test."""
    name = f"p2prejoin{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for cmd in (["link", "set", "lo", "up"], ["link", "set", "lo", "multicast", "on"],
                    ["route", "add", "224.0.0.0/4", "dev", "lo"]):
            subprocess.run(["ip", "-n", name, *cmd], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_a_restarted_peer_is_probed_again_and_rejoins_the_multicast_domain(job, multicast_netns):
    j = job(3, seconds=30, netns=multicast_netns, env={"P2PLEARN_TRANSPORT_MODE": "auto"})
    j.wait_ready()
    time.sleep(2.0)
    os.kill(j.ready[2][0], signal.SIGKILL)
    time.sleep(3.0)  # declared dead: its engine is forgotten, with everyone's reach of it
    j.start(2, seconds=15)
    codes = j.wait(timeout=180)
    assert codes[:2] == [0, 0] and codes[2] == -signal.SIGKILL and codes[3] == 0, j.output()
    r0, r2 = j.result(0), j.result(2)
    assert r2["rounds"] > 10, j.output()
    # Rank 0 saw rank 2 unicast-only once it died, then ranks 0-2 in one domain again (before the
    # re-probe, the restarted rank 2 stayed -1 until it left).
    seen = [d for d in r0["domains_seen"] if d is not None and len(d) == 3]
    died = next(i for i, d in enumerate(seen) if d[2] == -1)
    assert any(_one_domain(d) for d in seen[died:]), (r0["domains_seen"], j.output())
    assert any(_one_domain(d) for d in r2["domains_seen"] if d is not None), r2["domains_seen"]
    print(f"rank 0's views' domains: {r0['domains_seen']}; restarted rank 2's: {r2['domains_seen']}")


def _one_domain(domains):
    return len(domains) == 3 and len(set(domains)) == 1 and domains[0] >= 0
