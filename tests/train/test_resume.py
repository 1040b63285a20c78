"""Checkpoint and resume: a job stopped after a checkpoint and resumed with ``p2plearn-run
--resume`` ends bit for bit where an uninterrupted job ends (BSP, exact delivery, fixed seeds)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
RUN = [str(Path(sys.executable).parent / "p2plearn-run"), "-np", "2", "--sync", "bsp", "--selection", "all",
       "--filter", "value", "--deadline-ms", "5000"]  # a deadline only so that a busy host never skips a sender


def job(tmp: Path, ckpt: str, out: str, *extra: str, resume: bool = False, schedule: tuple[str, ...] = ()) -> str:
    (tmp / out).mkdir(exist_ok=True)
    argv = [*RUN, *schedule, *(["--resume", str(tmp / ckpt)] if resume else []), "--", sys.executable,
            str(HERE / "resume_peer.py"), "--ckpt", str(tmp / ckpt), "--out", str(tmp / out), *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=HERE.parent.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("schedule", [(), ("--period", "4", "--outer-lr", "0.7", "--outer-momentum", "0.9"),
                                      ("--period", "4", "--overlap"),
                                      ("--period", "4", "--overlap-steps", "3", "--overlap-alpha", "0.5"),  # in flight at a save
                                      ("--filter", "none", "--compress", "int8"),
                                      # changes, the aggregators' own error feedback, a resync round after the save
                                      ("--filter", "none", "--sync", "partitioned", "--compress", "int4", "--period", "4"),
                                      ("--filter", "none", "--period", "4", "--fragments", "2", "--bucket-mb", "0.001",
                                       "--outer-lr", "0.7", "--outer-momentum", "0.9")],
                         ids=["every-step", "period-outer", "overlap", "overlap-mixed", "compress", "partitioned-int4",
                              "fragments"])
def test_a_resumed_job_ends_bit_for_bit_where_an_uninterrupted_one_ends(tmp_path, schedule):
    # 42 steps an epoch: with --period 4 the checkpoints fall inside a period
    job(tmp_path, "ckpt-a", "a", schedule=schedule)
    first = job(tmp_path, "ckpt-b", "b", "--stop-after", "1", schedule=schedule)
    assert "epoch 1 saved" in first and "epoch 2 saved" not in first
    assert not list((tmp_path / "b").iterdir()), "the stopped job ran to the end"
    resumed = job(tmp_path, "ckpt-b", "b", resume=True, schedule=schedule)
    assert "resuming from step 42" in resumed, resumed[-2000:]
    assert "epoch 1 saved" not in resumed and "epoch 3 saved" in resumed
    for rank in (0, 1):
        want = torch.load(tmp_path / "a" / f"final-rank-{rank}.pt")
        got = torch.load(tmp_path / "b" / f"final-rank-{rank}.pt")
        assert want.keys() == got.keys()
        for name in want:
            assert torch.equal(want[name], got[name]), f"rank {rank}: {name} differs after resuming"
    # older steps are pruned: a rank that saved first has not seen the newest complete yet and
    # keeps its file of the step before until its next save
    kept = {p.name for p in (tmp_path / "ckpt-b").iterdir()}
    assert "step-126" in kept and kept <= {"step-84", "step-126"}


def test_resume_refuses_a_directory_without_a_complete_step(tmp_path):
    (tmp_path / "step-7").mkdir()
    (tmp_path / "step-7" / "rank-1.pt").write_bytes(b"")
    proc = subprocess.run([*RUN, "--resume", str(tmp_path), "--", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"--resume: no step in {tmp_path} was saved by all 2 ranks (newest: step 7, missing ranks 0)" \
        in proc.stderr
