"""The coordinator's port under launchers other than ours: no fixed port, and a taken port named at once."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from launch_helpers import PEER, ROOT, peers_seen
from p2plearn import runtime
from p2plearn.control.server import spawn
from p2plearn.rendezvous.coordinator import COORDINATOR_PORTS, coordinator_port
from p2plearn.runtime import PortInUse

mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Open MPI) is not installed")


def free_port():
    """A port with its next one free too (MASTER_PORT, and the coordinator's on MASTER_PORT + 1)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not runtime._port_taken(port + 1):
            return port


def test_the_port_rule():
    assert coordinator_port({"MASTER_PORT": "29500"}, "j", os_chooses=True) == 29501  # MASTER_PORT wins
    assert coordinator_port({}, "j", os_chooses=True) is None
    ports = {coordinator_port({}, f"slurm-{n}", os_chooses=False) for n in range(50)}
    assert ports <= set(COORDINATOR_PORTS) and len(ports) > 40  # spread by the job id
    assert coordinator_port({}, "slurm-1", os_chooses=False) == coordinator_port({}, "slurm-1", os_chooses=False)
    with pytest.raises(ValueError, match="MASTER_PORT='x' is not an integer"):
        coordinator_port({"MASTER_PORT": "x"}, "j", os_chooses=False)


def rank0_env(port, job_id="port-test"):
    return {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port - 1),
            "P2PLEARN_JOB_KEY": os.urandom(32).hex(), "P2PLEARN_JOB_ID": job_id}


def test_a_foreign_listener_on_the_port_is_named_at_once():
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(PortInUse) as caught:
            runtime.init(environ=rank0_env(port), timeout=60.0)
        assert time.monotonic() - started < 30.0  # the probe's seconds, not the 60 s timeout
    message = str(caught.value)
    assert "\n" not in message and f"port {port}" in message and "not a p2plearn coordinator" in message
    assert "set MASTER_PORT" in message


def test_ranks_on_one_host_do_not_use_master_port_plus_one(tmp_path):
    """torchrun picks MASTER_PORT among the ephemeral ports: its next one may be anything's, here a
    listener's. Ranks that share a host take a port the OS chooses, published in the job's files."""
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("P2PLEARN_")}
        env.update(PYTHONPATH=ROOT, XDG_RUNTIME_DIR=str(tmp_path), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port - 1), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", P2PLEARN_JOB_ID="one-host")
        ranks = [subprocess.Popen([sys.executable, PEER, "--out", str(tmp_path)], cwd=ROOT,
                                  env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True) for r in range(2)]
        try:
            outputs = [rank.communicate(timeout=120)[0] for rank in ranks]
        finally:
            for rank in ranks:
                if rank.poll() is None:
                    os.killpg(rank.pid, signal.SIGKILL)
                    rank.wait()
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    assert sorted(peers_seen(str(tmp_path))) == [0, 1]


def test_another_jobs_coordinator_on_the_port_is_named_at_once():
    port = free_port() + 1
    other = spawn("another-job", os.urandom(32).hex(), bind=f"tcp://0.0.0.0:{port}", world_size=2)
    try:
        with pytest.raises(PortInUse, match=f"port {port} on this host is held by another job's coordinator"):
            runtime.init(environ=rank0_env(port), timeout=60.0)
        env = {**rank0_env(port), "RANK": "1"}  # a rank that reaches it first: the same cause, not "wrong key"
        refused = f"refused this rank's job key: another job's coordinator holds port {port}"
        with pytest.raises(PortInUse, match=refused):
            runtime.init(environ=env, timeout=60.0)
    finally:
        other.stop()


@pytest.mark.slow
@mpirun
def test_two_mpirun_jobs_at_once_on_one_host_both_finish(tmp_path):
    """No MASTER_PORT, no key: each job's rank 0 takes a port the OS chooses and publishes it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("P2PLEARN_") and k != "MASTER_PORT"}
    env.update(PYTHONPATH=ROOT, XDG_RUNTIME_DIR=str(tmp_path))
    outs = [tmp_path / "a", tmp_path / "b"]
    jobs = []
    try:
        for out, other in zip(outs, reversed(outs)):
            out.mkdir()
            # Each job's peers wait, after their rendezvous, until the other job's rank 0 has had its own.
            argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH",
                    "-x", "XDG_RUNTIME_DIR", sys.executable, PEER, "--rounds", "2", "--out", str(out),
                    "--wait-for", str(other / "rank-0.json")]
            jobs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, start_new_session=True))
        outputs = [job.communicate(timeout=120)[0] for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGTERM)  # mpirun stops its ranks
                job.wait()
    for job, out, output in zip(jobs, outs, outputs):
        assert job.returncode == 0, output
        assert sorted(peers_seen(str(out))) == [0, 1], output
    assert len({peers_seen(str(out))[0]["job_id"] for out in outs}) == 2  # two jobs, not one
    assert list((tmp_path / "p2plearn").iterdir()) == []  # each job's last rank removed its files


@pytest.mark.slow
@mpirun
def test_short_mpirun_jobs_back_to_back_all_finish_and_leave_nothing(tmp_path):
    """Each job's rank 0 publishes a port of its own: nothing one job leaves can break the next."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("P2PLEARN_") and k != "MASTER_PORT"}
    env.update(PYTHONPATH=ROOT, XDG_RUNTIME_DIR=str(tmp_path))
    job_ids = set()
    for n in range(5):
        out = tmp_path / f"job{n}"
        out.mkdir()
        argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", "-x", "PYTHONPATH",
                "-x", "XDG_RUNTIME_DIR", sys.executable, PEER, "--out", str(out)]
        job = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
        try:
            output = job.communicate(timeout=120)[0]
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGTERM)
                job.wait()
        assert job.returncode == 0, f"job {n}: {output}"
        seen = peers_seen(str(out))
        assert sorted(seen) == [0, 1, 2, 3], output
        job_ids.add(seen[0]["job_id"])
        assert list((tmp_path / "p2plearn").iterdir()) == [], f"job {n} left its files"
    assert len(job_ids) == 5
