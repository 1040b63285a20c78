"""p2plearn-run end to end: environment, failures, signals, errors; and under the real mpirun."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from launch_helpers import PEER, ROOT, group_alive, peers_seen, run_peers_under_mpirun, wait_for
from p2plearn.launch.run import build_parser


def test_four_local_peers_get_their_environment_and_exit_0(launch, tmp_path):
    proc = launch("-np", "4", "--sync", "ssp", "--staleness", "3", "--log-dir", str(tmp_path / "logs"),
                  peer_args=["--rounds", "3", "--sync", "ssp", "--staleness", "3"])
    assert proc.returncode == 0, proc.stderr_text
    seen = peers_seen(str(tmp_path))
    assert sorted(seen) == [0, 1, 2, 3]
    for rank, info in seen.items():
        assert info["world_size"] == 4 and info["members"] == [0, 1, 2, 3]
        assert info["options"]["P2PLEARN_SYNC"] == "ssp" and info["options"]["P2PLEARN_STALENESS"] == "3"
        assert f"[{rank}] rank {rank} of 4 local {rank}/4" in proc.stdout_text
        with open(tmp_path / "logs" / f"rank-{rank}.log") as f:
            assert f"rank {rank} of 4" in f.read()
    assert "p2plearn-run: round" in proc.stdout_text  # the plain progress line (stdout is not a TTY)


def test_the_command_may_follow_without_a_double_dash(tmp_path):
    argv = [sys.executable, "-m", "p2plearn.launch", "-np", "2", sys.executable, PEER, "--out", str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    assert sorted(peers_seen(str(tmp_path))) == [0, 1]


def test_a_failing_peer_ends_the_job_non_zero_with_no_orphan(launch, tmp_path):
    proc = launch("-np", "4", peer_args=["--fail-rank", "2", "--exit", "1", "--hang"])
    assert proc.returncode == 1
    report = [line for line in proc.stderr_text.splitlines() if "rank 2 (on localhost) failed with exit code 1" in line]
    assert len(report) == 1 and "s into the job" in report[0]
    assert "its last stderr line: rank 2 failing on purpose" in report[0]
    assert proc.stderr_text.count("[2] rank 2 failing on purpose") == 1  # shown once, as it came
    seen = peers_seen(str(tmp_path))
    assert len(seen) == 4
    assert not [r for r, info in seen.items() if group_alive(info["pgid"])]


def test_elastic_keeps_the_others_running_and_says_so(launch, tmp_path):
    proc = launch("-np", "3", "--elastic", peer_args=["--fail-rank", "1", "--exit", "7"])
    assert "rank 1 (on localhost) failed with exit code 7" in proc.stderr_text
    assert "stopping the other peers" not in proc.stderr_text
    assert "finished with 2 of 3 ranks" in proc.stderr_text
    assert proc.returncode == 3, proc.stderr_text  # not 0: a rank failed; 3: the others finished


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_every_peer_within_5s(launch, tmp_path, sig):
    proc = launch("-np", "4", peer_args=["--hang"], wait=False)
    assert wait_for(lambda: len(peers_seen(str(tmp_path))) == 4, timeout=30), "peers did not start"
    seen = peers_seen(str(tmp_path))
    proc.send_signal(sig)
    started = time.monotonic()
    proc.communicate(timeout=10)  # read its output: a launcher blocked on a full pipe cannot stop
    elapsed = time.monotonic() - started
    assert proc.returncode == 128 + sig
    assert elapsed < 5.0
    assert not [r for r, info in seen.items() if group_alive(info["pgid"])]


@pytest.mark.parametrize("args, message", [
    (["-np", "2", "--sync", "async"], "argument --sync: invalid choice: 'async'"),
    (["-np", "2", "--loss-bound", "2"], "--loss-bound: must be in [0, 1)"),
    (["-np", "0"], "-np 0: must be >= 1"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["-np", "2", "--hostfile", "/nonexistent/hosts"], "hostfile /nonexistent/hosts: No such file"),
    (["-np", "9", "-H", "localhost:4"], "-np 9 needs 9 slots but the hosts give 4"),
    (["-np", "2", "-H", "nohost.invalid:2"], "host 'nohost.invalid' (-H) is unreachable over ssh"),
    (["-np", "2", "--emulate"], "--emulate: needs --topology"),
    (["-np", "2", "--testbed"], "--testbed needs --topology"),
    (["-np", "2", "--topology", "/nonexistent.json"], "--topology /nonexistent.json: no such file"),
    (["-np", "8", "--topology", "topology/heterogeneous-4.json", "--emulate"],
     "--emulate: -np 8 but " + os.path.join(ROOT, "topology/heterogeneous-4.json") + " has 4 peer slots (use -np 4"),
])
def test_bad_invocations_say_what_and_exit_2(launch, args, message):
    proc = launch(*args, command=[sys.executable, PEER])
    assert proc.returncode == 2
    lines = proc.stderr_text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("p2plearn-run: error: ") and message in lines[0], lines


def test_a_missing_script_is_reported(launch):
    proc = launch("-np", "2", command=[sys.executable, "no_such_train.py"])
    assert proc.returncode == 2
    assert "script not found: 'no_such_train.py'" in proc.stderr_text
    proc = launch("-np", "2", command=["no-such-program-xyz"])
    assert proc.returncode == 2 and "command not found: 'no-such-program-xyz'" in proc.stderr_text


def test_a_bad_hostfile_line_is_reported_with_its_place(launch, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two hosts\nlocalhost slots=2\n\nnode2 slots=many\n")
    proc = launch("--hostfile", str(hostfile), command=[sys.executable, PEER])
    assert proc.returncode == 2
    assert f"{hostfile}:4: slots: slot count 'many' is not a positive integer" in proc.stderr_text


def test_help_is_the_whole_manual():
    done = subprocess.run([sys.executable, "-m", "p2plearn.launch", "--help"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=30)
    assert done.returncode == 0 and "--hostfile hosts.txt" in done.stdout
    for section in ("Where peers run:", "Output:", "Stopping:", "Exit codes:", "Examples:"):
        assert section in done.stdout, section
    assert done.stdout.count("(default: None)") == 0 and "(default: none) (default" not in done.stdout
    for path in re.findall(r"topology/[\w-]+\.json", done.stdout):  # the examples name real files
        assert os.path.exists(os.path.join(ROOT, path)), path
    flags = [a for a in build_parser()._actions if a.option_strings and a.dest != "help"]
    assert [a.option_strings for a in flags if "default" not in (a.help or "")] == []  # each says its default


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Open MPI) is not installed")
def test_the_same_script_runs_under_mpirun(tmp_path):
    returncode, out = run_peers_under_mpirun(tmp_path, "mpi-test")
    assert returncode == 0, out
    seen = peers_seen(str(tmp_path))
    assert sorted(seen) == [0, 1, 2, 3]
    assert all(info["members"] == [0, 1, 2, 3] and info["world_size"] == 4 for info in seen.values())
    assert sorted(out.count(f"rank {r} of 4") for r in range(4)) == [1, 1, 1, 1]  # each ran once


@pytest.mark.root
def test_testbed_peers_run_in_namespaces_and_leave_none_behind(launch, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("--testbed needs root")
    pytest.importorskip("p2plearn.testbed")
    topology = os.path.join(ROOT, "topology", "homogeneous-4.json")
    if not os.path.exists(topology):
        pytest.skip("topology/homogeneous-4.json is not there")
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    proc = launch("-np", "4", "--topology", topology, "--testbed", peer_args=["--rounds", "2"])
    assert proc.returncode == 0, proc.stderr_text
    assert sorted(peers_seen(str(tmp_path))) == [0, 1, 2, 3]
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert set(after.split()) <= set(before.split())  # every namespace it built is gone


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_rank_averages_every_model_when_the_senders_lose_half_the_acknowledgements(launch, tmp_path):
    """The mnist1d example to its end on the testbed, ranks 1-3 losing half of what they receive (the
    root's acknowledgements of their final models among it): one rank prints the final average, of
    all 4 models. (When the root stopped its engine as soon as the models were in, a sender still
    asking heard silence and averaged its own model alone: 4 such jobs of 5 had 2-3 "averages".)"""
    if os.geteuid() != 0:
        pytest.skip("--testbed needs root")
    topology = tmp_path / "lossy-acks-4.json"
    topology.write_text(json.dumps({"nodes": [{"id": f"p{i}", "uplink_mbit": 100.0, "downlink_mbit": 100.0,
                                               "loss": 0.0 if i == 0 else 0.5} for i in range(4)]}))
    example = [sys.executable, "-m", "p2plearn.examples.mnist1d", "--epochs", "1", "--samples", "2000", "--width", "16"]
    proc = launch("-np", "4", "--topology", str(topology), "--testbed", command=example, wait=False)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the launcher takes its testbed down
        proc.communicate(timeout=30)
        raise
    assert proc.returncode == 0, err[-3000:]
    averaged = [line for line in out.splitlines() if "averaged model test accuracy" in line]
    assert len(averaged) == 1 and averaged[0].startswith("[0] "), out
    assert "4 of 4 peers' models" in averaged[0], out


def test_peers_share_the_cores_unless_the_user_chose_threads(launch, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = launch("-np", "2", env=env)
    assert proc.returncode == 0, proc.stderr_text
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert {info["threads"] for info in peers_seen(str(tmp_path)).values()} == {share}
    said = [line for line in proc.stderr_text.splitlines() if "OMP_NUM_THREADS=" in line]
    assert said == [f"p2plearn-run: OMP_NUM_THREADS={share} for each of the 2 peers here "
                    f"({len(os.sched_getaffinity(0))} cores); set OMP_NUM_THREADS to choose"]
    proc = launch("-np", "2", env={**env, "OMP_NUM_THREADS": "3"})
    assert proc.returncode == 0, proc.stderr_text
    assert {info["threads"] for info in peers_seen(str(tmp_path)).values()} == {"3"}
    assert "OMP_NUM_THREADS" not in proc.stderr_text  # the user's choice, silently


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sync", ["bsp", "ssp"])
def test_training_peers_stop_when_the_launcher_is_killed_with_both_cores_busy(launch, tmp_path, sync):
    """Peers in the middle of training (tests/faults/trainer.py), a CPU hog on every core: all gone
    within seconds of the launcher's SIGKILL, each with its one line."""
    from p2plearn.bench.startup import cpu_hog

    trainer = os.path.join(ROOT, "tests", "faults", "trainer.py")
    pids: dict[int, int] = {}
    coordinator: list[str] = []
    with cpu_hog(os.cpu_count() or 2):
        proc = launch("-np", "4", "--sync", sync, wait=False,
                      command=[sys.executable, trainer, "--seconds", "120", "--out", str(tmp_path)])
        try:
            for line in proc.stdout:  # "[r] ready <rank> <pid> <coordinator pid>" once a peer trains
                found = re.search(r"ready (\d+) (\d+) ", line)
                if found:
                    pids[int(found.group(1))] = int(found.group(2))
                if len(pids) == 4:
                    break
            assert len(pids) == 4, f"peers did not start: {proc.stderr.read()[-2000:]}"
            coordinator += subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "p2plearn.control"],
                                          capture_output=True, text=True).stdout.split()
            time.sleep(2.0)  # a few rounds in
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            killed = time.monotonic()

            def alive(pid):
                try:
                    os.kill(pid, 0)
                    return True
                except ProcessLookupError:
                    return False

            assert wait_for(lambda: not any(alive(pid) for pid in pids.values()), timeout=30), \
                "peers outlived their launcher"
            took = time.monotonic() - killed
        finally:  # the peers, and the launcher's coordinator (it would end after its linger)
            for pid in [*pids.values(), *map(int, coordinator)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    stderr = proc.stderr.read()
    for rank in range(4):
        assert f"p2plearn: rank {rank}: its launcher (p2plearn-run, pid {proc.pid}) died; stopping" in stderr, stderr
    print(f"{sync}: every training peer gone {took:.1f} s after the launcher's SIGKILL")


@pytest.mark.slow
def test_peers_stop_with_one_line_when_the_launcher_is_killed(launch, tmp_path):
    proc = launch("-np", "3", peer_args=["--hang"], wait=False)
    assert wait_for(lambda: len(peers_seen(str(tmp_path))) == 3, timeout=60), "peers did not start"
    seen = peers_seen(str(tmp_path))
    os.kill(proc.pid, signal.SIGKILL)  # the launcher alone, as the OOM killer or kill -9 would
    proc.wait()
    assert wait_for(lambda: not any(group_alive(info["pgid"]) for info in seen.values()), timeout=20), \
        "peers outlived their launcher"
    _, stderr = proc.communicate(timeout=30)  # the peers held a copy of its stderr: their lines are there
    for rank in range(3):
        lines = [line for line in stderr.splitlines() if f"rank {rank}: its launcher" in line]
        assert lines == [f"p2plearn: rank {rank}: its launcher (p2plearn-run, pid {proc.pid}) died; stopping"], stderr
