"""How ranks started by mpirun, srun or torchrun find rank 0's host."""

import os
import shutil
import subprocess
import sys
import types

import pytest

from p2plearn.rendezvous import coordinator
from p2plearn.rendezvous.coordinator import DiscoveryError, coordinator_host, first_slurm_node


def test_explicit_variables_win():
    env = {"P2PLEARN_COORDINATOR_HOST": "10.1.2.3", "MASTER_ADDR": "node7", "SLURM_JOB_NODELIST": "gpu[1-2]"}
    assert coordinator_host(env, 1, 8, 4) == "10.1.2.3"
    del env["P2PLEARN_COORDINATOR_HOST"]
    assert coordinator_host(env, 1, 8, 4) == "node7"


def test_slurm_node_lists():
    assert coordinator_host({"SLURM_STEP_NODELIST": "node[03-05,9],gpu1"}, 2, 8, 4) == "node03"
    assert first_slurm_node("gpu1,gpu2") == "gpu1"
    assert first_slurm_node("solo") == "solo"


def test_one_host_needs_nothing():
    assert coordinator_host({}, 3, 4, 4) == "127.0.0.1"


def test_several_hosts_without_a_way_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import fails as if not installed
    with pytest.raises(DiscoveryError, match="set P2PLEARN_COORDINATOR_HOST"):
        coordinator_host({}, 1, 8, 4)


def test_mpi4py_broadcasts_rank0s_address(monkeypatch):
    sent = []

    class World:
        @staticmethod
        def bcast(value, root):
            sent.append((value, root))
            return "192.168.7.7"

    fake = types.ModuleType("mpi4py")
    fake.MPI = types.SimpleNamespace(COMM_WORLD=World)
    monkeypatch.setitem(sys.modules, "mpi4py", fake)
    assert coordinator_host({}, 1, 8, 4) == "192.168.7.7"
    assert sent == [(None, 0)]  # a non-zero rank contributes nothing
    assert coordinator_host({}, 0, 8, 4) == "192.168.7.7"
    assert sent[1][0] == coordinator.outward_address()


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Open MPI) is not installed")
def test_under_real_open_mpi_every_rank_finds_this_host(tmp_path):
    # Each rank writes a file of its own: mpirun interleaves the ranks' stdout mid-line.
    code = ("import os; from p2plearn.rendezvous import coordinator_host, detect_rank;"
            "r, n, lr, ln = detect_rank(os.environ);"
            f"open(os.path.join({str(tmp_path)!r}, f'rank-{{r}}'), 'w').write(coordinator_host(os.environ, r, n, ln))")
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "P2PLEARN_COORDINATOR_HOST")}
    done = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, "-c", code],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [(tmp_path / f"rank-{r}").read_text() for r in range(2)] == ["127.0.0.1", "127.0.0.1"]
