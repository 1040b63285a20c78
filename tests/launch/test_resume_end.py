"""Issue 44: a rerun of a job that had trained to its end said "nothing left to train" only after all
its ranks' results (at the optimizer's close). Now the step where a job ended is marked, p2plearn-run
--resume names it before starting the ranks, and rank 0 says it as it resumes when the command is the same."""

import os
import re
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from launch_helpers import ROOT
from p2plearn import checkpoint

# The checkpointed loop (README) on a tiny model; the number of epochs is its one argument.
LOOP = """
import sys, p2plearn, torch, torch.nn.functional as F
epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
rt = p2plearn.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = p2plearn.DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, rt)
start = p2plearn.checkpoint.load(None, model, opt) or {}
for epoch in range(start.get("epoch", 0), epochs):
    for i in range(3):
        g = torch.Generator().manual_seed(10 * epoch + i)
        F.cross_entropy(model(torch.randn(4, 8, generator=g)), torch.randint(0, 2, (4,), generator=g)).backward()
        opt.step()
        opt.zero_grad()
    p2plearn.checkpoint.save("ckpt", model, opt, epoch=epoch + 1)
print(f"rank {rt.rank}: done")
opt.close()
"""
NOTHING_LEFT = "[0] p2plearn: nothing left to train: the checkpoint at step {} is the end"


def run(cwd, *script_args, resume=True):
    """p2plearn-run -np 2 [--resume ckpt] -- python loop.py ARGS; its output, both streams in order."""
    argv = [sys.executable, "-m", "p2plearn.launch", "-np", "2", "--period", "1", *(["--resume", "ckpt"] * resume),
            "--", sys.executable, "loop.py", *script_args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("P2PLEARN_", "MASTER_"))}
    proc = subprocess.Popen(argv, cwd=cwd, env={**env, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher's group: its peers have groups of their own,
            proc.wait()                          # which stop when they see their launcher gone
    assert proc.returncode == 0, out[-4000:]
    return out.splitlines()


@pytest.mark.slow
def test_the_end_of_a_finished_job_is_said_before_its_ranks_start_and_as_rank_0_resumes(tmp_path):
    (tmp_path / "loop.py").write_text(LOOP)
    fresh = run(tmp_path, resume=False)
    assert not [line for line in fresh if "nothing left" in line or "resuming" in line], fresh
    assert (tmp_path / "ckpt" / "step-6" / "end").is_file()  # the job ended at its last save

    rerun = run(tmp_path)
    said = [i for i, line in enumerate(rerun) if line.startswith("p2plearn-run: resuming from step 6 of ")]
    assert said and rerun[said[0]].endswith(", where the job that saved it ended: nothing left to train unless the "
                                            "script goes further"), rerun
    first_rank_line = min(i for i, line in enumerate(rerun) if re.match(r"\[\d\] ", line))
    assert said[0] < first_rank_line, rerun  # said before any rank started
    # the same command: rank 0 says it as it resumes, before the script's own lines after its loop, once
    assert rerun.count(NOTHING_LEFT.format(6)) == 1, rerun
    assert rerun.index(NOTHING_LEFT.format(6)) < rerun.index("[0] rank 0: done"), rerun
    assert any(re.match(r"\[0\] p2plearn rank 0: 0 rounds", line) for line in rerun), rerun

    # Another command (the same epochs, spelt out): no word as it resumes; at close, as before.
    other = run(tmp_path, "2")
    assert other.count(NOTHING_LEFT.format(6)) == 1, other
    assert other.index(NOTHING_LEFT.format(6)) > other.index("[0] rank 0: done"), other

    # More epochs: the launcher's word was "unless the script goes further"; it does, no rank says
    # there was nothing left, and the old end goes with its step.
    more = run(tmp_path, "3")
    assert not [line for line in more if line.startswith("[") and "nothing left" in line], more
    assert any(re.match(r"\[0\] p2plearn rank 0: 3 rounds", line) for line in more), more
    assert not (tmp_path / "ckpt" / "step-6" / "end").exists() and (tmp_path / "ckpt" / "step-9" / "end").is_file()


def closed(tmp_path, steps, saved_at, resumed=None, said=False):
    """checkpoint.closing on rank 0 of an optimizer at ``steps`` whose last save was at ``saved_at``."""
    (tmp_path / f"step-{saved_at}").mkdir(exist_ok=True)
    runtime = SimpleNamespace(rank=0, saved=(str(tmp_path), saved_at), said_nothing_left=said)
    checkpoint.closing(SimpleNamespace(runtime=runtime, steps=steps, resumed_step=resumed))
    return checkpoint.ended(tmp_path, saved_at)


def test_a_job_ends_where_it_closed_right_after_saving(tmp_path, capsys):
    assert closed(tmp_path, steps=6, saved_at=6) == checkpoint.this_command()
    assert closed(tmp_path, steps=7, saved_at=3) is None  # a step after the last save: not where it ended
    assert capsys.readouterr().out == ""


def test_a_rerun_that_trains_on_after_all_says_so(tmp_path, capsys):
    """load said there was nothing left (same command); the loop went on all the same (its end is
    in a file or a variable, not the command)."""
    closed(tmp_path, steps=9, saved_at=9, resumed=6, said=True)
    assert capsys.readouterr().out == ("p2plearn: trained on past step 6 after all (to step 9): what ends this "
                                       "script's loop is not in its command alone\n")
    closed(tmp_path, steps=6, saved_at=6, resumed=6, said=True)
    assert capsys.readouterr().out == ""  # said as it resumed: not again
    closed(tmp_path, steps=6, saved_at=6, resumed=6)
    assert capsys.readouterr().out == "p2plearn: nothing left to train: the checkpoint at step 6 is the end\n"
