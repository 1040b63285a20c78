"""Helpers of the launcher tests (a unique module name: every test folder is on sys.path)."""

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(ROOT, "tests", "launch", "peer.py")


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def peers_seen(out_dir):
    """What each peer wrote to ``out_dir`` (rank -> dict)."""
    seen = {}
    for path in glob.glob(os.path.join(out_dir, "rank-*.json")):
        with open(path) as f:
            info = json.load(f)
        seen[info["rank"]] = info
    return seen


def wait_for(predicate, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def run_peers_under_mpirun(tmp_path, job_id: str) -> tuple[int, str]:
    """4 ranks of the test peer (2 rounds) under real mpirun, writing to ``tmp_path``: its exit code
    and its output (stdout and stderr together); the process group is killed if it outlives 60 s."""
    with socket.socket() as s:  # rank 0 hosts the coordinator on MASTER_PORT + 1
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": ROOT, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port - 1),
           "P2PLEARN_JOB_KEY": os.urandom(32).hex(), "P2PLEARN_JOB_ID": job_id}
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4",
            "-x", "PYTHONPATH", "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "P2PLEARN_JOB_KEY",
            "-x", "P2PLEARN_JOB_ID", sys.executable, PEER, "--rounds", "2", "--out", str(tmp_path)]
    return run_job_command(argv, env, timeout=60)


def run_job_command(argv: list[str], env: dict, timeout: float, cwd=ROOT) -> tuple[int, str]:
    """A launcher's command: its exit code and output (stdout and stderr together); its process
    group is killed if it outlives ``timeout`` s."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out
