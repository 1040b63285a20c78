"""Host lists, hostfiles, placement, peer environment and the ssh command line (no remote host needed)."""

import os
import subprocess

import pytest

from p2plearn.launch import checks, run
from p2plearn.launch.env import peer_env, ssh_command
from p2plearn.launch.hosts import Host, HostError, parse_host_list, parse_hostfile, place
from p2plearn.options import Options
from p2plearn.rendezvous.variables import KEY_VAR


def test_hostfile_syntax(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# cluster\n\nnode1 slots=4   # big one\nnode2\nnode1 slots=2 max_slots=8\n")
    hosts = parse_hostfile(str(path))
    assert [(h.name, h.slots, h.where) for h in hosts] == [("node1", 6, f"{path}:3"), ("node2", 1, f"{path}:4")]


@pytest.mark.parametrize("text, message", [
    ("node1 slots=0\n", ":1: slots: slot count '0'"),
    ("node1 cpus=4\n", ":1: unknown field 'cpus=4'"),
    ("# nothing\n\n", "no hosts"),
])
def test_hostfile_errors_say_where(tmp_path, text, message):
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(HostError, match=message):
        parse_hostfile(str(path))


def test_host_list_and_placement():
    hosts = parse_host_list("a:2,b:3,c")
    assert [(h.name, h.slots) for h in hosts] == [("a", 2), ("b", 3), ("c", 1)]
    slots = place(hosts, 4)
    assert [(s.rank, s.host.name, s.local_rank, s.local_world_size) for s in slots] == [
        (0, "a", 0, 2), (1, "a", 1, 2), (2, "b", 0, 2), (3, "b", 1, 2)]
    with pytest.raises(HostError, match="-np 7 needs 7 slots"):
        place(hosts, 7)
    assert [s.host.name for s in place(hosts, 7, oversubscribe=True)] == ["a", "a", "b", "b", "b", "c", "a"]
    with pytest.raises(HostError, match="empty host name"):
        parse_host_list("a:2,,b")


def test_localhost_entries_are_local():
    assert Host("localhost", 1, "-H").local and Host(os.uname().nodename, 1, "-H").local
    assert not Host("node7.example", 1, "-H").local


def test_peer_env_has_everything_but_the_key():
    slot = place([Host("a", 2, "-H")], 2)[1]
    env = peer_env(slot, 2, "tcp://10.0.0.1:5000", "job1", Options(sync="ssp", fanout=3))
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["LOCAL_RANK"] == "1"
    assert env["LOCAL_WORLD_SIZE"] == "2" and env["P2PLEARN_COORDINATOR"] == "tcp://10.0.0.1:5000"
    assert env["P2PLEARN_JOB_ID"] == "job1" and env["P2PLEARN_SYNC"] == "ssp" and env["P2PLEARN_FANOUT"] == "3"
    assert KEY_VAR not in env


def test_ssh_command_reads_the_key_from_stdin_and_runs_the_peer(tmp_path):
    env = {"RANK": "3", "P2PLEARN_JOB_ID": "it's a job"}
    argv = ["sh", "-c", 'echo "$RANK|$P2PLEARN_JOB_ID|$P2PLEARN_JOB_KEY|$(pwd)"; exit 7']
    cmd = ssh_command("node9", env, argv, str(tmp_path))
    assert cmd[:2] == ["ssh", "-o"] and "BatchMode=yes" in cmd and cmd[-2] == "node9"
    assert "secret" not in " ".join(cmd)
    # What ssh would run on node9, run here: the remote shell gets cmd[-1] as its command line,
    # and ssh's stdin (the key, then held open) as its stdin.
    proc = subprocess.Popen(["sh", "-c", cmd[-1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        proc.stdin.write("secret\n")
        proc.stdin.flush()
        assert proc.wait(timeout=10) == 7
        assert proc.stdout.read().strip() == f"3|it's a job|secret|{tmp_path}"
    finally:
        proc.kill()
        proc.stdin.close()
        proc.wait()


def test_remote_peer_is_stopped_when_ssh_stdin_closes(tmp_path):
    """The launcher stopping (or dying) closes ssh's stdin: the remote watchdog stops the peer."""
    cmd = ssh_command("node9", {}, ["sleep", "30"], str(tmp_path))
    proc = subprocess.Popen(["sh", "-c", cmd[-1]], stdin=subprocess.PIPE, start_new_session=True)
    try:
        proc.stdin.write(b"key\n")
        proc.stdin.close()
        assert proc.wait(timeout=10) == 128 + 15  # SIGTERM from the watchdog, long before 30 s
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_emulate_passes_the_topology_to_every_peer(tmp_path, monkeypatch):
    topo = tmp_path / "t.json"
    topo.write_text("{}")
    monkeypatch.chdir(tmp_path)
    args, options, command = run.parse(["-np", "2", "--topology", "t.json", "--emulate", "python", "x.py"])
    env = peer_env(place([Host("localhost", 2, "default")], 2)[0], 2, "tcp://h:1", "j", options)
    assert env["P2PLEARN_TOPOLOGY"] == str(topo) and env["P2PLEARN_EMULATE"] == "1"
    assert command == ["python", "x.py"]


def test_topology_rates_seed_the_coordinator():
    topology = pytest.importorskip("p2plearn.topology")
    path = os.path.join(os.path.dirname(__file__), "..", "..", "topology", "heterogeneous-4.json")
    if not os.path.exists(path):
        pytest.skip("topology/heterogeneous-4.json is not there yet")
    rates = checks.topology_rates(path)
    topo = topology.load(path)
    assert rates[0] == (topo.uplink_bytes_per_s(topo.peers[0]), topo.downlink_bytes_per_s(topo.peers[0]))


@pytest.mark.parametrize("env, expected", [
    ({"LOCAL_WORLD_SIZE": "2"}, str(max(1, len(os.sched_getaffinity(0)) // 2))),  # the host's own share
    ({"LOCAL_WORLD_SIZE": "1000"}, "1"),
    ({"LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "5"}, "5"),  # the user's choice, passed on
])
def test_a_remote_peer_gets_its_hosts_share_of_threads(tmp_path, env, expected):
    cmd = ssh_command("node9", env, ["sh", "-c", 'echo "$OMP_NUM_THREADS"'], str(tmp_path))
    clean = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # as a fresh ssh session has
    proc = subprocess.Popen(["sh", "-c", cmd[-1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=clean)
    try:
        proc.stdin.write("key\n")
        proc.stdin.flush()  # held open, as ssh holds it: closing it would stop the peer
        assert proc.wait(timeout=10) == 0
        assert proc.stdout.read().strip().splitlines()[-1] == expected
    finally:
        proc.kill()
        proc.stdin.close()
        proc.wait()
