"""A DDP script runs under p2plearn-run as under torchrun: each peer gets what torch.distributed's
``env://`` rendezvous reads (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK)."""

import os
import sys

import pytest

from launch_helpers import run_job_command
from p2plearn.launch.env import peer_env, torch_store
from p2plearn.launch.hosts import Host, place
from p2plearn.options import Options

SCRIPT = """
import os
import sys
import torch
import torch.distributed as dist

import p2plearn  # noqa: F401  (after torch: registers the backend without the installed entry point)

dist.init_process_group("p2plearn")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
model(torch.ones(3, 4)).sum().backward()
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
print("rank", dist.get_rank(), "of", dist.get_world_size(), "local", os.environ["LOCAL_RANK"], "sum", total.item(),
      "grad equal", bool(torch.equal(model.module.weight.grad, torch.full((2, 4), 3.0))))
dist.destroy_process_group()
"""


def test_every_peer_gets_the_torch_store_of_rank_0(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    local = place([Host("localhost", 2, "-H")], 2)
    store = torch_store(local)
    assert store[0] == "127.0.0.1" and 0 < store[1] < 65536
    envs = [peer_env(slot, 2, "tcp://127.0.0.1:5000", "job1", Options(), store) for slot in local]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("127.0.0.1", str(store[1]))}
    assert [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"]) for e in envs] == [("0", "2", "0"), ("1", "2", "1")]
    # across hosts: rank 0's host as the others reach it
    assert torch_store(place([Host("node1", 1, "-H"), Host("localhost", 1, "-H")], 2))[0] == "node1"
    assert torch_store(place([Host("localhost", 1, "-H"), Host("node1", 1, "-H")], 2), advertise="10.0.0.5")[0] == "10.0.0.5"
    monkeypatch.setenv("MASTER_ADDR", "10.1.1.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert torch_store(local) == ("10.1.1.1", 29500)  # the user's choice


@pytest.mark.slow  # two peers import torch
def test_a_ddp_script_runs_under_p2plearn_run(launch, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    proc = launch("-np", "2", command=[sys.executable, str(script)],
                  env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout_text + proc.stderr_text
    for rank in (0, 1):
        assert f"rank {rank} of 2 local {rank} sum 1.0 grad equal True" in proc.stdout_text, proc.stdout_text


RESTARTED = """
import os
import torch
import torch.distributed as dist

import p2plearn  # noqa: F401

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("p2plearn")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
for step in range(4):
    if attempt == 0 and dist.get_rank() == 1 and step == 2:
        raise SystemExit("rank 1 fails in the first attempt")
    model(torch.ones(3, 4)).sum().backward()
print(f"rank {dist.get_rank()} attempt {attempt} done", flush=True)  # one write: the ranks share the pipe
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_restarts_a_ddp_job_whose_rank_failed(tmp_path):
    """torchrun --max-restarts 1: the second attempt's ranks find each other's new engines. torchrun
    hands it the same store, which still holds the first attempt's addresses: a rank that read them
    sent into the void ("unreachable"). (gloo, whose rendezvous reads that store too, fails this
    restart with torch 2.13: its connect to the first attempt's ports is refused.)"""
    script = tmp_path / "restarted.py"
    script.write_text(RESTARTED)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    returncode, out = run_job_command([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                       "--max-restarts", "1", "--monitor-interval", "0.5", str(script)],
                                      {**env, "OMP_NUM_THREADS": "1"}, timeout=240, cwd=tmp_path)
    assert returncode == 0, out[-4000:]
    for rank in (0, 1):
        assert f"rank {rank} attempt 1 done" in out, out[-4000:]


MADE_AGAIN = """
import torch
import torch.distributed as dist

import p2plearn  # noqa: F401

for world in range(3):
    dist.init_process_group("p2plearn")
    pair = dist.new_group([0, 1])
    x = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(x)
    dist.all_reduce(x, group=pair)
    print(f"rank {dist.get_rank()} world {world} sum {x[0].item():g}", flush=True)  # one write: the shared pipe
    dist.destroy_process_group()
for job in range(2):  # the training API's rendezvous, again and again
    rt = p2plearn.init(timeout=60)
    print(f"rank {rt.rank} job {job} of {rt.world_size}", flush=True)
    rt.close()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_world_made_again_in_the_same_processes_is_a_job_of_its_own(tmp_path):
    """init_process_group, destroy_process_group, three times in the same two ranks under torchrun
    (as gloo does), then p2plearn.init() and close twice: each is a job of its own. Before, the
    second found the first's coordinator address in the job's files (a rank still held them) and
    waited on it (the backend: for good; init(): 60 s, then raised)."""
    script = tmp_path / "made_again.py"
    script.write_text(MADE_AGAIN)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    returncode, out = run_job_command([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                       str(script)], {**env, "OMP_NUM_THREADS": "1"}, timeout=240, cwd=tmp_path)
    assert returncode == 0, out[-4000:]
    for rank in (0, 1):
        for world in range(3):
            assert f"rank {rank} world {world} sum 6" in out, out[-4000:]
        for job in range(2):
            assert f"rank {rank} job {job} of 2" in out, out[-4000:]
