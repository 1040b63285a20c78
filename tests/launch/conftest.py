"""Run p2plearn-run as a subprocess; every process it or its peers started is killed afterwards."""

import os
import signal
import subprocess
import sys

import pytest

from launch_helpers import PEER, ROOT, group_alive, peers_seen


@pytest.fixture
def launch(tmp_path):
    """``launch(*launcher_args, peer_args=[...], wait=True, env=None)`` -> Popen (finished if ``wait``).

    Peers run tests/launch/peer.py with ``--out tmp_path``; ``env`` replaces the launcher's
    environment (PYTHONPATH added); everything is killed at teardown, the job's coordinator too.
    """
    procs = []

    def start(*args, peer_args=(), wait=True, command=None, timeout=60, env=None):
        command = command or [sys.executable, PEER, "--out", str(tmp_path), *peer_args]
        argv = [sys.executable, "-m", "p2plearn.launch", *args, "--", *command]
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**(os.environ if env is None else env), "PYTHONPATH": ROOT},
                                start_new_session=True)
        procs.append(proc)
        if wait:
            proc.stdout_text, proc.stderr_text = proc.communicate(timeout=timeout)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for info in peers_seen(str(tmp_path)).values():
        if group_alive(info["pgid"]):
            os.killpg(info["pgid"], signal.SIGKILL)
        # A coordinator outlives a launcher killed in a test until its linger ends: not past the test.
        found = subprocess.run(["pgrep", "-f", f"p2plearn.control --job-id {info['job_id']} "], capture_output=True,
                               text=True)
        for pid in found.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
