"""The job's secret under launchers that pass none (mpirun, srun, torchrun), and the keys derived from it."""

import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import types

import pytest

from p2plearn.control import Client, ControlError
from p2plearn.keys import control_key, data_key, hkdf
from p2plearn.launch import secret
from p2plearn.launch.secret import SecretError, job_secret

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(ROOT, "tests", "launch", "peer.py")


def test_hkdf_matches_rfc5869_test_case_1():
    okm = hkdf(bytes([0x0B] * 22), bytes(range(0xF0, 0xFA)), 42, salt=bytes(range(13)))
    assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
                         "34007208d5b887185865")


def test_control_and_data_keys_are_distinct_and_not_the_secret():
    secret_hex = "ab" * 32
    control, data = control_key(secret_hex), data_key(secret_hex, "j")
    assert len(control) == 32 and len(data) == 32
    assert data != control and bytes.fromhex(secret_hex) not in (control, data)
    assert control_key(bytes.fromhex(secret_hex)) == control  # hex text and its bytes are one secret


def test_a_set_key_wins_and_one_peer_draws_its_own():
    assert job_secret({"P2PLEARN_JOB_KEY": "cafe"}, "j", 1, 8, 4).value == "cafe"
    one, other = job_secret({}, "j", 0, 1, 1).value, job_secret({}, "j", 0, 1, 1).value
    assert len(one) == 64 and one != other


def test_ranks_on_one_host_share_a_private_key_file(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path), "MASTER_PORT": "29500"}
    first = job_secret(env, "mpi-7", 0, 4, 4)
    others = [job_secret(env, "mpi-7", r, 4, 4) for r in (1, 2, 3)]
    assert len(first.value) == 64 and {s.value for s in others} == {first.value}
    assert first.created is not None and all(s.created is None for s in others)  # the first one made it
    assert stat.S_IMODE(first.created.stat().st_mode) == 0o600
    assert stat.S_IMODE(first.created.parent.stat().st_mode) == 0o700
    assert job_secret(env, "mpi-8", 0, 4, 4).value != first.value  # another job, another key
    assert job_secret({**env, "MASTER_PORT": "29600"}, "mpi-7", 0, 4, 4).value != first.value
    first.discard()
    assert not first.created.exists()
    assert [p.name for p in first.created.parent.iterdir() if p.name.startswith(".")] == []  # no drafts left


def test_a_key_directory_others_can_open_is_refused(tmp_path):
    shared = tmp_path / "p2plearn"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(SecretError, match="only this user can open"):
        job_secret({"XDG_RUNTIME_DIR": str(tmp_path)}, "j", 0, 2, 2)


def test_several_hosts_without_a_key_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import fails as if not installed
    with pytest.raises(SecretError, match="P2PLEARN_JOB_KEY is not set.*mpirun -x P2PLEARN_JOB_KEY"):
        job_secret({}, "j", 1, 8, 4)


def test_several_hosts_get_rank0s_key_through_mpi4py(monkeypatch):
    sent = []

    class World:
        @staticmethod
        def bcast(value, root):
            sent.append((value, root))
            return "feed" * 16

    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=types.SimpleNamespace(COMM_WORLD=World)))
    assert job_secret({}, "j", 1, 8, 4).value == "feed" * 16
    assert sent == [(None, 0)]  # a non-zero rank contributes nothing
    job_secret({}, "j", 0, 8, 4)
    assert len(sent[1][0]) == 64  # rank 0 draws a fresh key


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Open MPI) is not installed")
def test_a_job_under_mpirun_without_a_key_refuses_an_outsider(tmp_path):
    with socket.socket() as s:  # rank 0 hosts the coordinator on MASTER_PORT + 1
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("P2PLEARN_")}
    env.update(PYTHONPATH=ROOT, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port - 1), XDG_RUNTIME_DIR=str(tmp_path))
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH", "-x", "MASTER_ADDR",
            "-x", "MASTER_PORT", "-x", "XDG_RUNTIME_DIR", sys.executable, PEER, "--hang", "--out", str(tmp_path)]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"rank-{r}.json").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "slow"
            time.sleep(0.2)
        job_id = json.loads((tmp_path / "rank-0.json").read_text())["job_id"]
        assert job_id != "local"  # Open MPI's job id
        (key_file,) = (tmp_path / "p2plearn").iterdir()
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        # What the first version keyed such a job with, and what anyone could compute: refused now.
        for guess in (hashlib.sha256(f"p2plearn:{job_id}".encode()).hexdigest(), secret.secrets.token_hex(32)):
            with pytest.raises(ControlError, match="refused|authentic"):
                outsider = Client(f"127.0.0.1:{port}", job_id, guess, rank=None, connect_timeout=10.0)
                try:
                    outsider.register(None, join=True)
                finally:
                    outsider.close()
    finally:
        _stop_mpirun_job(proc, tmp_path)


def _stop_mpirun_job(proc: subprocess.Popen, out) -> None:
    """SIGTERM to mpirun (it stops its ranks; a SIGKILLed mpirun would leave them), then the stragglers."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for seen in out.glob("rank-*.json"):
        info = json.loads(seen.read_text())
        pids = [info["pid"]]
        # Coordinators (rank 0's, and a successor a rank started as the job stopped) have sessions of their own.
        found = subprocess.run(["pgrep", "-f", f"p2plearn.control --job-id {info['job_id']} "], capture_output=True,
                               text=True)
        for pid in pids + [int(p) for p in found.stdout.split()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
