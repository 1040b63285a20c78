"""Building and removing testbeds, from Python and from the CLI (root where marked)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2plearn.testbed import cli as testbed_cli
from p2plearn.testbed.state import remove_state, state_path
from p2plearn.testbed.system import remove_namespaces
from testbed_helpers import (
    assert_nothing_left,
    built_testbed,
    eventually,
    measure_until,
    peer,
    processes_mentioning,
    unique_name,
)

REPOSITORY = Path(__file__).resolve().parents[2]
SHIPPED_TOPOLOGY = REPOSITORY / "topology" / "homogeneous-4.json"
PERIODIC_EVENT = {"at_s": 0.5, "duration_s": 0.2, "every_s": 1.0, "loss": 0.3}


def cli(*args, **kwargs):
    """Run ``python -m p2plearn.testbed ARGS``; returns the CompletedProcess."""
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY), **kwargs.pop("env", {})}
    return subprocess.run([sys.executable, "-m", "p2plearn.testbed", *args], env=env,
                          capture_output=True, text=True, timeout=120, **kwargs)


@pytest.fixture
def leftover_names():
    """Names of testbeds a test builds through the CLI: removed at teardown whatever happens."""
    names = []
    try:
        yield names
    finally:
        for name in names:
            remove_namespaces(name)
            remove_state(name)


@pytest.mark.root
def test_exit_removes_everything_also_when_the_body_raises():
    nodes = [peer("p0", 100, 100, events=[PERIODIC_EVENT]), peer("p1", 100, 100)]
    with pytest.raises(RuntimeError, match="test body failed"):
        with built_testbed(nodes) as testbed:
            name = testbed.name
            sleeper = testbed.run("p0", ["sleep", "60"])
            assert eventually(lambda: processes_mentioning(f"p2plearn.testbed.scheduler {name}"))
            raise RuntimeError("test body failed")
    assert sleeper.poll() is not None
    assert_nothing_left(name)


@pytest.mark.root
def test_cli_up_status_exec_measure_and_down_after_a_crash(tmp_path, leftover_names):
    topology = tmp_path / "two.json"
    topology.write_text(json.dumps({"nodes": [
        peer("p0", 100, 100),
        peer("p1", 50, 200, loss=0.1, events=[PERIODIC_EVENT | {"at_s": 30.0}]),
    ]}))
    name = unique_name()
    leftover_names.append(name)

    up = cli("up", str(topology), "--name", name)
    assert up.returncode == 0, up.stderr
    assert "10.77." in up.stdout and f"p2pl-{name}-1" in up.stdout

    taken = cli("up", str(topology), "--name", name)
    assert taken.returncode == 2 and "is taken" in taken.stderr

    assert name in cli("status").stdout
    shown = cli("exec", name, "p1", "--", "ip", "-o", "-4", "addr", "show", "dev", "p2pl-p1")
    assert shown.returncode == 0 and "inet 10.77." in shown.stdout

    def measure():
        measured = cli("measure", name, "--seconds", "0.5", "--datagrams", "1000")
        assert measured.returncode == 0, measured.stderr
        rows = {line.split()[0]: line.split() for line in measured.stdout.splitlines()[1:3]}
        # p0's and p1's uplink as a fraction of their rate, and p1's loss in %
        return float(rows["p0"][1]) / 100, float(rows["p1"][1]) / 50, float(rows["p1"][5])

    def as_configured(row):
        p0_up, p1_up, p1_loss = row
        return 0.85 <= p0_up <= 1.03 and 0.85 <= p1_up <= 1.03 and abs(p1_loss - 10) <= 4

    results = measure_until(measure, as_configured)
    assert as_configured(results[-1]), results
    assert all(max(row[:2]) <= 1.03 for row in results), results

    # A crash: the process that built it is long gone, and now its state file too.
    assert eventually(lambda: processes_mentioning(f"p2plearn.testbed.scheduler {name}"))
    state_path(name).unlink()
    assert "no state file" in cli("status").stdout
    down = cli("down", name)
    assert down.returncode == 0, down.stderr
    assert_nothing_left(name)


@pytest.mark.root
def test_down_refuses_unknown_names():
    result = cli("down", unique_name())
    assert result.returncode == 2 and "no testbed named" in result.stderr


def test_up_refuses_without_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert testbed_cli.main(["up", str(SHIPPED_TOPOLOGY)]) == 2
    assert "need root" in capsys.readouterr().err


def test_up_refuses_when_a_tool_is_missing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert testbed_cli.main(["up", str(SHIPPED_TOPOLOGY)]) == 2
    assert "'ip' not found: apt-get install iproute2" in capsys.readouterr().err
