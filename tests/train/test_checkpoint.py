"""p2plearn.checkpoint: the layout, the newest complete step, pruning, and what load refuses."""
from __future__ import annotations

import threading
import time

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
