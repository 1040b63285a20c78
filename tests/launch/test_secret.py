"""The job's secret under launchers that pass none (mpirun, srun, torchrun), and the keys derived from it."""

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import types

import pytest

from p2plearn.control import Client, ControlError
from p2plearn.keys import control_key, data_key, hkdf
from p2plearn.rendezvous import secret
from p2plearn.rendezvous.jobfiles import JobFiles, JobFilesError
from p2plearn.rendezvous.secret import SecretError, job_secret

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
    assert job_secret({"P2PLEARN_JOB_KEY": "cafe" * 8}, 1, 8, 4).value == "cafe" * 8  # 16 bytes: the least taken
    one, other = job_secret({}, 0, 1, 1).value, job_secret({}, 0, 1, 1).value
    assert len(one) == 64 and one != other


def test_a_key_shorter_than_16_bytes_is_refused_in_one_line():
    """Issue 44: a one-byte P2PLEARN_JOB_KEY keyed every frame and datagram of the job."""
    for short in ("k", "cafe" * 7 + "ca", "fifteen-bytes!!"):  # text, hex (15 bytes), text (15 bytes)
        with pytest.raises(SecretError, match=r"^P2PLEARN_JOB_KEY has \d+ bytes, fewer than 16") as error:
            job_secret({"P2PLEARN_JOB_KEY": short}, 1, 8, 4)
        assert "\n" not in str(error.value) and "openssl rand -hex 32" in str(error.value)
    assert job_secret({"P2PLEARN_JOB_KEY": "sixteen-bytes!!!"}, 1, 8, 4).value == "sixteen-bytes!!!"


def test_ranks_on_one_host_share_a_private_key_file(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path), "MASTER_PORT": "29500"}
    files = [JobFiles(env, "mpi-7") for _ in range(4)]
    try:
        keys = [job_secret(env, r, 4, 4, files[r]).value for r in range(4)]
        assert len(keys[0]) == 64 and set(keys) == {keys[0]}
        key_file = files[0].path / "key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(files[0].path.stat().st_mode) == 0o700
        assert stat.S_IMODE(files[0].path.parent.stat().st_mode) == 0o700
        for other_env, job in ((env, "mpi-8"), ({**env, "MASTER_PORT": "29600"}, "mpi-7")):  # another job, another key
            other = JobFiles(other_env, job)
            assert job_secret(other_env, 0, 4, 4, other).value != keys[0]
            other.close()
        for f in files[:3]:
            f.close()
        assert key_file.exists()  # rank 3 still runs
        files[3].close()
        assert not files[0].path.exists()  # the last one out removed the job's files
        assert list(files[0].path.parent.iterdir()) == []  # no drafts either
    finally:
        for f in files:
            f.close()


def _rank_holding_the_key(env, job_id):
    """A process that takes the job's key file as a rank does, then waits to be killed."""
    code = ("import sys, time; from p2plearn.rendezvous.jobfiles import JobFiles;"
            f"files = JobFiles({env!r}, {job_id!r}); files.key(); print('ready', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_the_key_file_is_removed_by_whichever_rank_survives(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    rank0 = _rank_holding_the_key(env, "mpi-9")  # arrives first: creates the key
    try:
        survivor = JobFiles(env, "mpi-9")
        survivor.key()
        rank0.kill()  # SIGKILL: no clean-up of its own
        rank0.wait()
        assert (survivor.path / "key").exists()
        survivor.close()
        assert not survivor.path.exists()
    finally:
        rank0.kill()
        rank0.wait()


def test_files_of_a_job_whose_ranks_were_all_killed_go_with_the_next_job(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    killed = [_rank_holding_the_key(env, "mpi-10") for _ in range(2)]
    for proc in killed:
        proc.kill()
        proc.wait()
    (abandoned,) = (tmp_path / "p2plearn").iterdir()
    running = _rank_holding_the_key(env, "mpi-11")  # a job that still runs keeps its files
    try:
        nxt = JobFiles(env, "mpi-12")
        assert not abandoned.exists()
        assert len(list((tmp_path / "p2plearn").iterdir())) == 2  # the running job's, and the new one's
        nxt.close()
    finally:
        running.kill()
        running.wait()


def test_a_key_directory_others_can_open_is_refused(tmp_path):
    shared = tmp_path / "p2plearn"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(JobFilesError, match="only this user can open"):
        JobFiles({"XDG_RUNTIME_DIR": str(tmp_path)}, "j")


def test_several_hosts_without_a_key_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import fails as if not installed
    with pytest.raises(SecretError, match="P2PLEARN_JOB_KEY is not set.*mpirun -x P2PLEARN_JOB_KEY"):
        job_secret({}, 1, 8, 4)


def test_several_hosts_get_rank0s_key_through_mpi4py(monkeypatch):
    sent = []

    class World:
        @staticmethod
        def bcast(value, root):
            sent.append((value, root))
            return "feed" * 16

    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=types.SimpleNamespace(COMM_WORLD=World)))
    assert job_secret({}, 1, 8, 4).value == "feed" * 16
    assert sent == [(None, 0)]  # a non-zero rank contributes nothing
    job_secret({}, 0, 8, 4)
    assert len(sent[1][0]) == 64  # rank 0 draws a fresh key


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Open MPI) is not installed")
def test_a_job_under_mpirun_without_a_key_refuses_an_outsider(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("P2PLEARN_")}
    env.update(PYTHONPATH=ROOT, MASTER_ADDR="127.0.0.1", MASTER_PORT="29400", XDG_RUNTIME_DIR=str(tmp_path))
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
        (job_dir,) = (tmp_path / "p2plearn").iterdir()
        assert stat.S_IMODE((job_dir / "key").stat().st_mode) == 0o600
        address = (job_dir / "address").read_text().strip()  # the port rank 0's OS chose (not MASTER_PORT + 1)
        # What the first version keyed such a job with, and what anyone could compute: refused now.
        for guess in (hashlib.sha256(f"p2plearn:{job_id}".encode()).hexdigest(), secret.secrets.token_hex(32)):
            with pytest.raises(ControlError, match="refused|authentic"):
                outsider = Client(address, job_id, guess, rank=None, connect_timeout=10.0)
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
