"""The transformer language-model example: its corpus, its loop with two peers averaging, its manual,
and (slow) a 2-peer job under the launcher that checkpoints and resumes."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from p2plearn.checkpoint import newest_complete
from p2plearn.examples import charlm
from p2plearn.train.data import stdlib_sources, stdlib_text

TINY = ["--layers", "1", "--dim", "32", "--heads", "2", "--context", "32", "--corpus-mb", "0.3", "--batch-size", "8",
        "--lr", "3e-3", "--eval-windows", "32"]


def test_stdlib_corpus_is_next_byte_windows_with_a_held_out_tail():
    data = stdlib_text(context=16, max_bytes=100_000, validation_fraction=0.1)
    assert data.x.shape[1] == 16 and data.classes == 256
    assert torch.equal(data.x[:, 1:], data.y[:, :-1]), "y is x shifted by one byte"
    first_file = Path(stdlib_sources()[0]).read_bytes()
    stream = torch.cat([data.x[:3], data.y[:3, -1:]], 1).reshape(-1)
    assert bytes(stream.tolist()) == first_file[:51], "windows of 17 bytes, one after the other, from the first file"
    assert 85_000 <= len(data) * 17 <= 90_000 and 9_983 <= len(data.y_test) * 17 <= 10_000
    again = stdlib_text(context=16, max_bytes=100_000, validation_fraction=0.1)
    assert torch.equal(again.x, data.x) and torch.equal(again.y_test, data.y_test), "every rank reads the same corpus"


def test_loss_falls_with_two_peers_averaging(job):
    """Two in-process peers run the example's loop (charlm.train) with DecentralizedOptimizer,
    averaging every 5 steps: the validation loss after 30 steps is well under the first one."""
    runtime, optimizer = job
    args = charlm.parse_args([*TINY, "--steps", "30", "--eval-every", "10", "--log-every", "10"])
    torch.set_num_threads(1)
    data = stdlib_text(args.context, int(args.corpus_mb * 1e6))
    models = [charlm.make_model(args), charlm.make_model(args)]
    assert all(torch.equal(a, b) for a, b in zip(models[0].parameters(), models[1].parameters()))
    rts = [runtime(0), runtime(1)]
    opts: dict[int, object] = {}
    threads = [threading.Thread(target=lambda r=r, m=m: opts.update({r.rank: optimizer(
        r, m, charlm.make_optimizer(args, m), period=5)})) for r, m in zip(rts, models)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    histories: dict[int, list] = {}
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        opt = opts[rank]

        def step(loss: torch.Tensor) -> None:
            opt.step(loss=loss)
            opt.zero_grad()

        try:
            histories[rank] = charlm.train(args, models[rank], data, rank, 2, step)
        except BaseException as error:  # noqa: B036 - reported by the test's thread
            errors.append(error)

    workers = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(300)
    assert not errors, errors
    assert opts[0].stats().rounds == 6, "a round every 5 of the 30 steps"
    for rank, history in histories.items():
        losses = [loss for _, loss in history]
        assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
        assert losses[-1] < losses[0] - 0.5 and losses[-1] < math.log(256) - 1.0, (rank, losses)


def test_help_is_the_manual():
    with pytest.raises(SystemExit) as exit_:
        charlm.parse_args(["--help"])
    assert exit_.value.code == 0


def test_help_names_the_size_flags_and_the_device(capsys):
    with pytest.raises(SystemExit):
        charlm.parse_args(["--help"])
    manual = capsys.readouterr().out
    for flag in ("--layers", "--dim", "--heads", "--context", "--device", "--checkpoint", "--sync", "p2plearn-run -np 4"):
        assert flag in manual, flag


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_peers_under_the_launcher_checkpoint_and_resume(tmp_path):
    """main() under p2plearn-run: 20 steps saving every 10, then a rerun to 30 steps resumes at step 20."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "result.json"

    def launch(steps: int) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "p2plearn.launch", "-np", "2", "--period", "5", "--sync", "partitioned", "--",
               sys.executable, "-m", "p2plearn.examples.charlm", *TINY, "--steps", str(steps), "--eval-every", "10",
               "--checkpoint", str(ckpt), "--json", str(out)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})

    first = launch(20)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert newest_complete(ckpt, 2) == 20
    result = json.loads(out.read_text())
    assert result["steps"] == 20 and result["rounds"] == 4 and math.isfinite(result["averaged_loss"])
    assert "validation loss" in first.stdout and "perplexity" in first.stdout
    second = launch(30)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming from" in second.stdout and "step-20" in second.stdout
    resumed = json.loads(out.read_text())
    assert resumed["steps"] == 30 and [len(resumed["history"])] == [1], resumed["history"]
