"""--robust in the simulator: one lying peer ruins the plain merge and not the robust one; the refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest

from p2plearn.examples.mnist1d import make_model
from p2plearn.options import ROBUST_PARTITIONED, Options
from p2plearn.sim.__main__ import main, parser
from p2plearn.sim.attacks import attacked_training  # the experiments' attacker, not a copy of it
from p2plearn.sim.train import Settings
from p2plearn.topology import load
from p2plearn.train.data import mnist1d

JOB = ["--topology", "topology/heterogeneous-8.json", "--sync", "bsp", "--compress", "none", "--fanout", "1", "--model", "mlp",
       "--hidden", "32", "--samples", "4000", "--steps", "96", "--period", "4", "--batch-size", "32",
       "--eval-every", "96", "--eval-peers", "7", "--step-ms", "2", "--eval-ms", "0"]


def honest_accuracy(attack: str, robust: str) -> tuple[float, dict]:
    """8 virtual peers, BSP; rank 7 sends what `attack` makes of its model: the honest ranks' mean
    accuracy at the end, and the run's result."""
    args = parser().parse_args(["train", *JOB, "--robust", robust])
    options = Options.from_args(args)
    settings = Settings(batch_size=32, steps=args.steps, eval_every=args.eval_every, eval_peers=args.eval_peers,
                        step_s=0.002, eval_s=0.0)
    training = attacked_training(attack, [7])(options, settings, load(options.topology), mnist1d(args.samples),
                                              lambda: make_model(args), "mlp-32")
    result = training.run()
    return result["history"][-1][2], result


def test_one_sign_flipper_ruins_the_plain_merge_and_not_the_clipped_one():
    clean, _ = honest_accuracy("none", "clip")
    ruined, _ = honest_accuracy("sign flip", "none")
    held, result = honest_accuracy("sign flip", "clip")
    assert clean > 0.3          # the job learns: the comparison means something
    assert ruined < 0.2         # chance is 0.1: the flipped updates took every model they reached
    assert held > clean - 0.05  # clipped: within 5 points of the clean run
    attacker = result["robust"]["senders"][7]
    assert attacker["clipped"] > 0.8 * attacker["merges"]  # clipped in most of its merges
    honest = [s for r, s in result["robust"]["senders"].items() if r != 7]
    assert sum(s["clipped"] for s in honest) < 0.1 * sum(s["merges"] for s in honest)


def test_compressed_messages_merge_robustly_and_the_result_says_so(tmp_path):
    out = tmp_path / "out.json"
    assert main(["train", *JOB, "--compress", "int8", "--robust", "clip", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["robust"]["mode"] == "clip"
    senders = result["robust"]["senders"]
    assert sorted(map(int, senders)) == list(range(8))
    assert all(s["merges"] > 0 for s in senders.values())


def test_partitioned_with_robust_is_refused_with_trainings_message(capsys):
    assert main(["train", *JOB, "--sync", "partitioned", "--robust", "clip"]) == 2
    assert ROBUST_PARTITIONED in capsys.readouterr().err
    with pytest.raises(ValueError, match="one peer aggregates each part"):
        Options(sync="partitioned", robust="trimmed")


def test_excluded_attacker_is_counted_by_its_receivers():
    args = parser().parse_args(["train", *JOB, "--robust", "clip", "--robust-exclude"])
    options = Options.from_args(args)
    settings = Settings(batch_size=32, steps=args.steps, eval_every=args.eval_every, eval_peers=args.eval_peers,
                        step_s=0.002, eval_s=0.0)
    training = attacked_training("gaussian", [7])(options, settings, load(options.topology), mnist1d(args.samples),
                                                  lambda: make_model(args), "mlp-32")
    result = training.run()
    senders = result["robust"]["senders"]
    assert senders[7]["excluded_by"]  # a receiver that merged it often enough stopped
    assert all(not s["excluded_by"] for r, s in senders.items() if r != 7)
    assert np.isfinite(result["own_accuracy"])
