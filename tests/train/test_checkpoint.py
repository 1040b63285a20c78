"""p2plearn.checkpoint: the layout, the newest complete step, pruning, and what load refuses."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from p2plearn import checkpoint
from tests.train.conftest import on_peers


def touch(root, rnd, *ranks):
    (root / f"step-{rnd}").mkdir(exist_ok=True)
    for r in ranks:
        (root / f"step-{rnd}" / f"rank-{r}.pt").write_bytes(b"")


def test_the_newest_complete_step_is_the_newest_every_rank_saved(tmp_path):
    touch(tmp_path, 10, 0, 1, 2)
    touch(tmp_path, 20, 0, 2)        # rank 1 had not saved step 20 when the job stopped
    (tmp_path / "step-30").mkdir()  # and nobody step 30
    (tmp_path / "step-20" / ".rank-1.pt.tmp").write_bytes(b"")  # a save cut short is not a file
    assert checkpoint.steps(tmp_path) == {10: {0, 1, 2}, 20: {0, 2}, 30: set()}
    assert checkpoint.newest_complete(tmp_path, 3) == 10
    assert checkpoint.newest_complete(tmp_path, 2) == 10  # step 20 lacks rank 1 in a job of 2 too
    assert checkpoint.newest_complete(tmp_path, 4) is None
    assert checkpoint.describe(tmp_path, 4) == (f"no step in {tmp_path} was saved by all 4 ranks (newest: step "
                                                f"30, missing ranks 0, 1, 2, 3)")
    assert checkpoint.newest_complete(tmp_path / "absent", 1) is None
    assert "holds no checkpoint" in checkpoint.describe(tmp_path / "absent", 1)


def test_resumable_refuses_another_jobs_size_and_skipped_names_a_partial_step(tmp_path):
    """Issue 44: a 4-rank checkpoint under -np 2 was 'complete' (ranks 0 and 1 are there), and a step
    only some ranks saved (Ctrl-C while saving) was skipped without a word."""
    touch(tmp_path, 225, 0, 1, 2, 3)
    assert checkpoint.resumable(tmp_path, 4) == 225
    with pytest.raises(checkpoint.CheckpointError) as error:
        checkpoint.resumable(tmp_path, 2)
    assert str(error.value) == (f"{tmp_path}/step-225 was saved by a job of 4 ranks, this one has 2 (run 4 ranks, or "
                                f"resume from a checkpoint of 2)")
    with pytest.raises(checkpoint.CheckpointError, match="no step in .* was saved by all 8 ranks"):
        checkpoint.resumable(tmp_path, 8)
    assert checkpoint.skipped(tmp_path, 4, 225) is None
    touch(tmp_path, 240, 0, 2)
    touch(tmp_path, 250, 1)
    assert checkpoint.skipped(tmp_path, 4, 225) == (f"{tmp_path}/step-250 was saved by ranks 1 of 4 only (and 1 older "
                                                    f"partial steps) (a job stopped while saving): skipped, resuming "
                                                    f"from step 225")


def test_a_step_folder_another_rank_prunes_while_this_one_lists_is_skipped(tmp_path, monkeypatch):
    """Ranks prune on their own: the last one removes an emptied folder, maybe between another
    rank's listing of the checkpoint directory and of that folder (it crashed a rank's save)."""
    touch(tmp_path, 10, 0, 1)
    touch(tmp_path, 20, 0, 1)
    listed = checkpoint.Path.iterdir

    def iterdir(path):
        if path.name == "step-10":  # pruned by the other rank just now
            for f in path.glob("rank-*.pt"):
                f.unlink()
            path.rmdir()
        return listed(path)

    monkeypatch.setattr(checkpoint.Path, "iterdir", iterdir)
    assert checkpoint.steps(tmp_path) == {20: {0, 1}}


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def train(opt, steps):
    for i in range(steps):
        g = torch.Generator().manual_seed(i)
        F.cross_entropy(opt.model(torch.randn(16, 8, generator=g)), torch.randint(0, 2, (16,), generator=g)).backward()
        opt.step()
        opt.zero_grad()


def test_save_then_load_restores_model_optimizer_and_objects_and_prunes(job, tmp_path, monkeypatch):
    monkeypatch.delenv(checkpoint.RESUME_VAR, raising=False)

    def body(rank, opt):
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        assert checkpoint.load(tmp_path, opt.model, opt, scheduler=sched) is None  # nothing yet: fresh start
        assert checkpoint.load(None, opt.model, opt) is None                      # no --resume either
        with pytest.raises(ValueError, match="reserved"):
            checkpoint.save(tmp_path, opt.model, opt, model=1)
        for epoch in range(3):
            train(opt, 2)
            sched.step()
            checkpoint.save(tmp_path, opt.model, opt, scheduler=sched, epoch=epoch + 1)
        saved = {k: v.clone() for k, v in opt.model.state_dict().items()}
        train(opt, 2)  # moves on after the last checkpoint
        sched.step()
        restored_sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        extra = checkpoint.load(tmp_path, opt.model, opt, scheduler=restored_sched)
        with pytest.raises(checkpoint.CheckpointError, match="holds no scaler"):
            checkpoint.load(tmp_path, opt.model, opt, scaler=torch.amp.GradScaler("cpu"))
        train(opt, 1)  # both peers take this round at the restored clock
        return extra, saved, opt.last_round.round, restored_sched.last_epoch

    for extra, saved, rnd, last_epoch in on_peers(job, [mlp(), mlp()], body):
        assert extra == {"epoch": 3}
        assert rnd == 6, "the round after loading is the checkpoint's"
        assert last_epoch == 3
    assert sorted(p.name for p in tmp_path.iterdir())[-1] == "step-6"
    assert "step-2" not in {p.name for p in tmp_path.iterdir()}


def test_load_names_the_partial_step_it_skips_and_marks_the_runtime_resumed(job, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(checkpoint.RESUME_VAR, raising=False)
    saved = threading.Barrier(2)

    def body(rank, opt):
        train(opt, 2)
        checkpoint.save(tmp_path, opt.model, opt)
        before = opt.runtime.resumed_step
        if saved.wait(30) == 0:
            touch(tmp_path, 9, 0)  # only rank 0 saved step 9
        saved.wait(30)
        checkpoint.load(tmp_path, opt.model, opt)
        return before, opt.runtime.resumed_step

    assert on_peers(job, [mlp(), mlp()], body) == [(None, 2), (None, 2)]
    said = capsys.readouterr().out.splitlines()
    assert said == [f"p2plearn: {tmp_path}/step-9 was saved by ranks 0 of 2 only (a job stopped while saving): "
                    f"skipped, resuming from step 2", f"p2plearn: resuming from {tmp_path}/step-2"]  # rank 0 only


def test_resume_var_promises_a_complete_step(job, tmp_path, monkeypatch):
    touch(tmp_path, 4, 0)
    monkeypatch.setenv(checkpoint.RESUME_VAR, str(tmp_path))

    def body(rank, opt):
        with pytest.raises(checkpoint.CheckpointError, match="missing ranks 1"):
            checkpoint.load(None, opt.model, opt)
        opt.step()
        return True

    assert on_peers(job, [mlp(), mlp()], body) == [True, True]


def test_a_peer_that_joined_keeps_the_running_jobs_model_and_clock(job, tmp_path):
    runtime, optimizer = job
    models = [mlp(), mlp()]
    opts = [None, None]
    threads = [threading.Thread(target=lambda r=r: opts.__setitem__(r, optimizer(runtime(r), models[r])))
               for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stop = threading.Event()
    workers = [threading.Thread(target=lambda o=o: [train(o, 1) for _ in iter(stop.is_set, True)]) for o in opts]
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + 30
        while min(o.sync.clock for o in opts) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # a checkpoint of an older state, as a restarted peer would find its own
        stale = mlp()
        with torch.no_grad():
            for p in stale.parameters():
                p.fill_(7.0)
        (tmp_path / "step-1").mkdir()
        for r in (0, 1, 2):  # the joiner gets rank 2 here (a restarted peer would get its own back)
            torch.save({"model": stale.state_dict(), "world_size": 2, "rng": torch.get_rng_state(),
                        "optimizer": {**torch.optim.SGD(stale.parameters(), lr=0.1).state_dict(),
                                      "p2plearn": {"clock": 1}}},
                       tmp_path / "step-1" / f"rank-{r}.pt")
        joiner = optimizer(runtime(None, join=True), mlp())
        assert joiner.joined
        clock = joiner.sync.clock
        checkpoint.load(tmp_path, joiner.model, joiner)
        assert joiner.sync.clock == clock > 1, "the joiner went back to its checkpoint's clock"
        assert not any(torch.all(p == 7.0) for p in joiner.model.parameters()), "the stale model was loaded"
    finally:
        stop.set()
        for w in workers:
            w.join(30)


def test_a_file_that_cannot_be_resumed_from_is_refused_in_one_line_naming_it(job, tmp_path, monkeypatch):
    """Empty, truncated, garbage or foreign files, and a model that does not fit: each one
    CheckpointError line with the file and the reason (they were bare EOFError, RuntimeError,
    UnpicklingError and KeyError tracebacks)."""
    monkeypatch.delenv(checkpoint.RESUME_VAR, raising=False)
    saved = threading.Barrier(2)

    def body(rank, opt):
        train(opt, 2)
        path = checkpoint.save(tmp_path, opt.model, opt, epoch=1)
        saved.wait(30)  # by both ranks: the step is complete
        good = path.read_bytes()
        foreign = tmp_path / f"foreign-{rank}.pt"
        torch.save({"weights": torch.zeros(3)}, foreign)
        cases = {"empty": b"", "truncated": good[:len(good) // 2], "garbage": bytes(range(256)) * 40,
                 "foreign": foreign.read_bytes()}
        errors = {}
        for case, content in cases.items():
            path.write_bytes(content)
            with pytest.raises(checkpoint.CheckpointError) as error:
                checkpoint.load(tmp_path, opt.model, opt)
            errors[case] = str(error.value)
        path.write_bytes(good)
        wider = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        with pytest.raises(checkpoint.CheckpointError) as error:
            checkpoint.load(tmp_path, wider, opt)
        errors["another model"] = str(error.value)
        assert checkpoint.load(tmp_path, opt.model, opt) == {"epoch": 1}  # the whole file still loads
        return path, errors

    for path, errors in on_peers(job, [mlp(), mlp()], body):
        for case, message in errors.items():
            assert message.startswith(f"{path}: ") and "\n" not in message and len(message) < 500, (case, message)
        assert errors["empty"] == f"{path}: not a readable checkpoint (empty file)"
        assert errors["truncated"].startswith(f"{path}: not a readable checkpoint (")
        assert errors["garbage"].startswith(f"{path}: not a readable checkpoint (10240 bytes, ")
        assert errors["foreign"] == f"{path}: not a p2plearn checkpoint (it holds no model, optimizer, rng, world_size)"
        assert errors["another model"].startswith(f"{path}: does not fit what it is loaded into (RuntimeError: ")
        assert "size mismatch for 2.weight" in errors["another model"]


def test_nan_or_inf_in_a_checkpoint_is_refused_unless_asked(job, tmp_path, monkeypatch):
    """A checkpoint of a diverged job resumed silently (loss nan, exit 0)."""
    monkeypatch.delenv(checkpoint.RESUME_VAR, raising=False)
    saved = threading.Barrier(2)

    def body(rank, opt):
        train(opt, 2)
        path = checkpoint.save(tmp_path, opt.model, opt)
        saved.wait(30)
        good = torch.load(path, weights_only=True)
        errors = []
        for part, poison in (("model", lambda s: s["model"]["0.weight"].__setitem__((0, 0), float("nan"))),
                             ("optimizer", lambda s: s["optimizer"]["p2plearn"]["previous"][0].fill_(float("inf")))):
            state = torch.load(path, weights_only=True)
            poison(state)
            torch.save(state, path)
            with pytest.raises(checkpoint.CheckpointError) as error:
                checkpoint.load(tmp_path, opt.model, opt)
            errors.append(str(error.value))
            assert torch.isfinite(opt.model[0].weight).all(), "a refused checkpoint was loaded"
            torch.save(good, path)
        state["model"]["0.weight"][0, 0] = float("nan")
        torch.save(state, path)
        checkpoint.load(tmp_path, opt.model, opt, allow_nonfinite=True)
        loaded = bool(torch.isnan(opt.model[0].weight[0, 0]))
        torch.save(good, path)
        checkpoint.load(tmp_path, opt.model, opt)
        return path, errors, loaded

    for path, (model_error, optimizer_error), loaded in on_peers(job, [mlp(), mlp()], body):
        assert model_error == (f"{path}: the model state holds NaN or inf (in 0.weight); training from it goes "
                               f"nowhere (load(..., allow_nonfinite=True) loads it anyway)")
        assert optimizer_error.startswith(f"{path}: the optimizer state holds NaN or inf (in p2plearn.previous.0)")
        assert loaded, "allow_nonfinite=True did not load the NaN"


def test_rank_0_says_which_step_it_resumes_from(job, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(checkpoint.RESUME_VAR, raising=False)
    saved = threading.Barrier(2)

    def body(rank, opt):
        train(opt, 3)
        checkpoint.save(tmp_path, opt.model, opt, epoch=2)
        saved.wait(30)
        checkpoint.load(tmp_path, opt.model, opt)
        return opt.resumed_step

    assert on_peers(job, [mlp(), mlp()], body) == [3, 3]
    resumed = [line for line in capsys.readouterr().out.splitlines() if "resuming" in line]
    assert resumed == [f"p2plearn: resuming from {tmp_path / 'step-3'} (epoch=2)"]


LOOP = """
import p2plearn, torch, torch.nn.functional as F
rt = p2plearn.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = p2plearn.DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, rt)
start = p2plearn.checkpoint.load("ckpt", model, opt) or {}
for epoch in range(start.get("epoch", 0), 2):
    for i in range(3):
        g = torch.Generator().manual_seed(10 * epoch + i)
        F.cross_entropy(model(torch.randn(4, 8, generator=g)), torch.randint(0, 2, (4,), generator=g)).backward()
        opt.step()
        opt.zero_grad()
    p2plearn.checkpoint.save("ckpt", model, opt, epoch=epoch + 1)
opt.close()
"""


@pytest.mark.slow
def test_a_rerun_of_a_finished_job_says_there_is_nothing_left_to_train(tmp_path):
    """The same command resumes; a finished job's rerun trained 0 rounds and printed the old
    results with no word. `rm -rf ckpt` (or another directory) starts afresh."""
    (tmp_path / "loop.py").write_text(LOOP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("P2PLEARN_", "MASTER_"))}
    env["OMP_NUM_THREADS"] = "1"
    command = [str(Path(sys.executable).parent / "p2plearn-run"), "-np", "2", "--period", "1", "--",
               sys.executable, "loop.py"]
    outputs = []
    for _ in range(2):
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        outputs.append(done.stdout)
    fresh, rerun = outputs
    assert "resuming" not in fresh and "nothing left" not in fresh, fresh
    assert re.search(r"rank 0: 6 rounds", fresh), fresh
    assert "[0] p2plearn: resuming from ckpt/step-6 (epoch=2)" in rerun.splitlines(), rerun
    assert "[0] p2plearn: nothing left to train: the checkpoint at step 6 is the end" in rerun.splitlines(), rerun
    assert "[1] p2plearn: resuming" not in rerun and "[1] p2plearn: nothing" not in rerun, rerun
