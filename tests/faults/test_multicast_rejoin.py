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
    j.wait_line(0, "rank 2 declared dead", timeout=30)  # its engine is forgotten, with everyone's reach of it
    j.start(2, seconds=15)
    codes = j.wait(timeout=180)
    assert codes[:2] == [0, 0] and codes[2] == -signal.SIGKILL and codes[3] == 0, j.output()
    r0, r2 = j.result(0), j.result(2)
    # (1 round in 1 of 12 runs: its first round waited the 30 s cap, as a peer not taken for a joiner
    # does; what it saw is in the message, for the next failure to be read)
    assert r2["rounds"] > 10, (r2["clocks"][:3], r2["events"][:12], r2["rounds_log"][:2], j.output())
    # Every view the restarted process held came after its new engine was registered (and the
    # others' reach of the old one forgotten): ranks 0-2 share one domain only if ranks 0 and 1
    # probed the new engine and said so (before, it stayed -1, unicast only, until it left).
    assert any(_one_domain(d) for d in r2["domains_seen"] if d is not None), (r2["domains_seen"], j.output())
    print(f"rank 0's views' domains: {r0['domains_seen']}; restarted rank 2's: {r2['domains_seen']}")


def _one_domain(domains):
    return len(domains) == 3 and len(set(domains)) == 1 and domains[0] >= 0
