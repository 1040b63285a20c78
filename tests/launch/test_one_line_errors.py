"""Issue 44: a mistake in the setup is one line and exit code 2 under every launcher, and what is
likely a mistake is said once (a typo of a variable, no launcher, a --resume never loaded, ...)."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from launch_helpers import PEER, ROOT

mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Open MPI) is not installed")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
# A script as a user writes it: the error comes from inside init(), not from a launcher's check.
SCRIPT = "import p2plearn\nrt = p2plearn.init(timeout=30)\nprint('rank', rt.rank, 'ran')\nrt.close(linger=0)\n"
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def clean_env(**extra):
    """The environment of a user's shell: no job variables (the test runner's own may hold some)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("P2PLEARN_", "MASTER_", "OMPI_", "SLURM_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    return {**env, "PYTHONPATH": ROOT, **extra}


def run(argv, env, timeout=120):
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


def script(tmp_path, text=SCRIPT):
    path = tmp_path / "train.py"
    path.write_text(text)
    return str(path)


def test_an_option_error_in_a_plain_script_is_one_line_and_exit_code_2(tmp_path):
    code, out, err = run([sys.executable, script(tmp_path)], clean_env(P2PLEARN_SYNC="bogus"))
    assert code == 2
    assert err.splitlines() == ["p2plearn: error: --sync: must be one of bsp, ssp, partitioned (got 'bogus' from "
                                "P2PLEARN_SYNC)"]


def test_any_setup_error_a_script_lets_through_is_one_line_and_exit_code_2(tmp_path):
    """A checkpoint of another job, raised by the script's own checkpoint.load, ends the same way;
    anything else keeps its traceback."""
    text = ("import p2plearn.checkpoint as c\nraise c.CheckpointError('ckpt/step-225/rank-0.pt: saved by a job of 4 "
            "ranks, this one has 2')\n")
    code, _, err = run([sys.executable, script(tmp_path, text)], clean_env())
    assert (code, err) == (2, "p2plearn: error: ckpt/step-225/rank-0.pt: saved by a job of 4 ranks, this one has 2\n")
    code, _, err = run([sys.executable, script(tmp_path, "import p2plearn\nraise ValueError('mine')\n")], clean_env())
    assert code == 1 and "Traceback (most recent call last)" in err and "ValueError: mine" in err


def test_a_bad_rank_variable_under_srun_is_one_line_and_exit_code_2(tmp_path):
    """srun is not installed here: its variables, set by hand, are what init() reads."""
    env = clean_env(SLURM_PROCID="x", SLURM_NTASKS="4", SLURM_JOB_ID="e44")
    code, _, err = run([sys.executable, script(tmp_path)], env)
    assert (code, err) == (2, "p2plearn: error: SLURM_PROCID='x' is not an integer\n")


def untagged(output: str) -> list[str]:
    """mpirun's lines without the "[rank] " each rank's writes start with."""
    return [re.sub(r"^\[\d+\] ", "", line) for line in output.splitlines()]


@mpirun
def test_an_option_error_under_mpirun_is_one_line_per_rank_and_exit_code_2(tmp_path):
    argv = [*MPIRUN, "-x", "PYTHONPATH", "-x", "P2PLEARN_PERIOD", sys.executable, script(tmp_path)]
    code, out, err = run(argv, clean_env(P2PLEARN_PERIOD="abc"))
    assert code == 2, out + err
    ours = [line for line in untagged(err) if line.startswith("p2plearn")]
    assert ours and set(ours) == {"p2plearn: error: --period: not a valid int (got 'abc' from P2PLEARN_PERIOD)"}
    assert "Traceback" not in out + err


@mpirun
def test_a_held_coordinator_port_under_mpirun_is_one_line_and_exit_code_2(tmp_path):
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port - 1), P2PLEARN_JOB_KEY=os.urandom(32).hex())
        argv = [*MPIRUN, "-x", "PYTHONPATH", "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "P2PLEARN_JOB_KEY",
                sys.executable, script(tmp_path)]
        code, out, err = run(argv, env)
    assert code == 2, out + err
    ours = [line for line in untagged(err) if line.startswith("p2plearn: error")]  # rank 1 only waited for it
    assert len(ours) == 1 and ours[0].startswith(f"p2plearn: error: the coordinator's port {port} on this host is "
                                                 f"held by a program that is not a p2plearn coordinator"), err
    assert "Traceback" not in out + err


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(TORCHRUN), reason="torchrun is not installed")
def test_an_option_error_under_torchrun_is_one_line_and_exit_code_2(tmp_path):
    """It was our line per rank, then torchrun's traceback and a 21-line summary (43 lines), exit code 1."""
    code, out, err = run([TORCHRUN, "--nproc-per-node", "2", script(tmp_path)],
                         clean_env(P2PLEARN_SYNC="bogus", OMP_NUM_THREADS="1"))
    line = "p2plearn: error: --sync: must be one of bsp, ssp, partitioned (got 'bogus' from P2PLEARN_SYNC)"
    assert code == 2, err
    ours = [text for text in err.splitlines() if line in text]
    # once, by torchrun for its ranks: each stopped on it, or (the one that failed second) by torchrun
    assert len(ours) == 1 and re.fullmatch(re.escape(line) + r" \[torchrun: (ranks 0, 1|rank [01]; rank [01] "
                                           r"stopped by torchrun)\]", ours[0]), err
    assert "Traceback" not in out + err and "FAILED" not in err, err
    # what is left is torchrun's log of the failure (a SIGTERM sent, the rank that failed, no error file)
    assert len(err.splitlines()) <= 4, err


def test_the_threads_are_shared_out_under_srun_unless_the_user_chose(tmp_path):
    """4 ranks of torch's default threads on 2 cores ran 4.7x slower: init() gives each its share."""
    torch = pytest.importorskip("torch")
    cores = len(os.sched_getaffinity(0))
    check = ("import os, torch, p2plearn\ntorch.set_num_threads(os.cpu_count() or 1)  # torch's default: every core\n"
             "p2plearn.init(timeout=30).close(linger=0)\nprint(torch.get_num_threads())\n")
    # One rank of a job that srun says puts 2 x cores ranks on this host.
    srun = dict(SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_TASKS_PER_NODE=str(2 * cores), SLURM_JOB_ID="e44")
    env = {k: v for k, v in clean_env(**srun).items() if k != "OMP_NUM_THREADS"}
    code, out, err = run([sys.executable, script(tmp_path, check)], env)
    assert code == 0 and out.split() == ["1"], err
    assert (f"p2plearn: {2 * cores} ranks share this host's {cores} cores: each runs 1 torch thread "
            f"(torch.set_num_threads(1)); set OMP_NUM_THREADS to choose") in err.splitlines()
    # Before torch is imported: the variable torch reads when it loads.
    late = "import os, p2plearn\np2plearn.init(timeout=30).close(linger=0)\nimport torch\nprint(torch.get_num_threads())\n"
    code, out, err = run([sys.executable, script(tmp_path, late)], env)
    assert code == 0 and out.split() == ["1"], err
    # An explicit choice wins: only a warning.
    code, out, err = run([sys.executable, script(tmp_path, check)], {**env, "OMP_NUM_THREADS": "2"})
    assert code == 0 and out.split() == [str(cores)] and "set OMP_NUM_THREADS=1 for every rank" in err, err
    del torch


def test_a_variable_nothing_reads_is_named_with_the_nearest_known_one(tmp_path):
    from p2plearn.options import unknown_variables

    assert unknown_variables({"P2PLEARN_SYNCH": "ssp", "P2PLEARN_SYNC": "bsp", "P2PLEARN_JOB_KEY": "k",
                              "P2PLEARN_ZZQX": "1", "SYNCH": "1"}) == [
        "p2plearn: P2PLEARN_SYNCH is not a p2plearn variable, ignored; did you mean P2PLEARN_SYNC?",
        "p2plearn: P2PLEARN_ZZQX is not a p2plearn variable, ignored"]
    code, _, err = run([sys.executable, script(tmp_path)], clean_env(P2PLEARN_SYNCH="ssp"))
    assert code == 0
    assert "p2plearn: P2PLEARN_SYNCH is not a p2plearn variable, ignored; did you mean P2PLEARN_SYNC?" in err


def test_a_script_without_a_launcher_says_so_once(tmp_path):
    twice = SCRIPT + "p2plearn.init(timeout=30).close(linger=0)\n"
    code, out, err = run([sys.executable, script(tmp_path, twice)], clean_env())
    assert code == 0 and "rank 0 ran" in out
    assert err.splitlines() == ["p2plearn: no launcher's variables found (p2plearn-run, torchrun, mpirun, srun): "
                                "this process trains alone, as rank 0 of 1"]


def checkpoint_of(root, ranks, step=225):
    folder = root / "ckpt" / f"step-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        (folder / f"rank-{r}.pt").write_bytes(b"")  # the launcher checks the names; load() reads them
    return str(root / "ckpt")


def test_resume_from_a_checkpoint_of_another_size_is_refused_at_launch(launch, tmp_path):
    ckpt = checkpoint_of(tmp_path, 4)
    proc = launch("-np", "2", "--resume", ckpt, command=[sys.executable, PEER])
    assert proc.returncode == 2
    assert proc.stderr_text.splitlines() == [
        f"p2plearn-run: error: --resume: {ckpt}/step-225 was saved by a job of 4 ranks, this one has 2 (run 4 "
        f"ranks, or resume from a checkpoint of 2)"]


def test_resume_names_a_partial_step_and_says_when_the_script_never_loaded(launch, tmp_path):
    ckpt = checkpoint_of(tmp_path, 2)
    checkpoint_of(tmp_path, 1, step=300)  # rank 1 was stopped while saving step 300
    proc = launch("-np", "2", "--resume", ckpt)  # peer.py never calls checkpoint.load
    assert proc.returncode == 0, proc.stderr_text
    assert (f"p2plearn-run: {ckpt}/step-300 was saved by ranks 0 of 2 only (a job stopped while saving): skipped, "
            f"resuming from step 225") in proc.stderr_text
    assert (f"[0] p2plearn: p2plearn-run --resume {ckpt}: this script never called p2plearn.checkpoint.load(None, "
            f"...), so it trained from scratch") in proc.stderr_text


@pytest.mark.parametrize("command", [[sys.executable], [sys.executable, "-u"], [sys.executable, "-W", "error"]])
def test_python_without_a_script_is_refused(launch, command):
    proc = launch("-np", "2", command=command)
    assert proc.returncode == 2
    lines = proc.stderr_text.splitlines()
    assert len(lines) == 1 and "no script (python would read its program from stdin)" in lines[0], lines


def test_np_other_than_the_topologys_peers_is_said(launch, tmp_path):
    topology = os.path.join(ROOT, "topology", "heterogeneous-4.json")
    proc = launch("-np", "3", "--topology", topology)
    assert proc.returncode == 0, proc.stderr_text
    assert f"p2plearn-run: note: -np 3 but {topology} has 4 peers" in proc.stderr_text
