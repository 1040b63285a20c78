"""Helpers shared by the testbed tests."""

import contextlib
import functools
import itertools
import os
import subprocess
import time
from pathlib import Path

from p2plearn.testbed import Testbed
from p2plearn.testbed.state import state_path
from p2plearn.testbed.system import namespaces
from p2plearn.topology import Topology

_serial = itertools.count()


def unique_name():
    """A testbed name that no other test (or test run on this machine) uses at once."""
    return f"t{os.getpid() % 100000}n{next(_serial)}"


def peer(name, up_mbit, down_mbit, **fields):
    """A topology node."""
    return {"id": name, "uplink_mbit": up_mbit, "downlink_mbit": down_mbit, **fields}


@contextlib.contextmanager
def built_testbed(nodes):
    """A testbed of ``nodes`` that is up inside the block and removed after, also on failure."""
    with Testbed(Topology.from_data({"nodes": nodes}), unique_name()) as testbed:
        yield testbed


def on(testbed, peer_name):
    """The 'spawn' the p2plearn.testbed.probe helpers take: run in that peer's namespace."""
    return functools.partial(testbed.run, peer_name)


def processes_mentioning(text):
    """PIDs of live processes whose command line contains ``text``.

    A process in the middle of exec shows an empty command line: poll with ``eventually``.
    """
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes().replace(b"\0", b" "):
                found.append(int(proc.name))
        except OSError:
            pass  # the process ended while we looked
    return found


def eventually(predicate, timeout_s=3.0):
    """Poll ``predicate`` until it is true or ``timeout_s`` passes; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


def assert_nothing_left(name):
    """No namespace, state file, process or root-namespace link of testbed ``name`` remains."""
    prefix = f"p2pl-{name}-"
    assert [namespace for namespace in namespaces() if namespace.startswith(prefix)] == []
    assert not state_path(name).exists()
    assert processes_mentioning(f"p2plearn.testbed.scheduler {name}") == []
    assert processes_mentioning(prefix) == []
    root_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert "p2pl-" not in root_links


def measure_until(measure, passes, attempts=5, pause_s=1.0):
    """Call ``measure()`` until ``passes(result)``, at most ``attempts`` times ``pause_s`` apart (a
    burst of other work on the host passes); all results, in order.

    On a busy 2-core machine a probe may wait for a core long enough to fall short of a link's
    rate, or start too late for an event; load never makes a shaped link faster. So a lower bound
    holds if one of a few measurements meets it (the last result), while upper bounds are checked
    on every result.
    """
    results = [measure()]
    while not passes(results[-1]) and len(results) < attempts:
        time.sleep(pause_s)
        results.append(measure())
    return results
