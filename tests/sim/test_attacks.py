"""The attacks of `p2plearn.sim.attacks`: what each sends (against a numpy reference), that the
receivers of a virtual run merge exactly that, the `p2plearn-sim train --attack` flags, and each
attack's effect bounded by --robust clip on a small job."""
from __future__ import annotations

import json

import numpy as np
import pytest

from p2plearn.examples.mnist1d import make_model
from p2plearn.options import Options
from p2plearn.sim import attacks
from p2plearn.sim.__main__ import main, parser
from p2plearn.sim.attacks import ATTACKS, Attack, attacked_training
from p2plearn.sim.train import Settings
from p2plearn.topology import load
from p2plearn.train.data import mnist1d
from tests.sim.test_robust import JOB, honest_accuracy


def rounds_of_messages(count: int, n: int = 5, size: int = 64) -> list[np.ndarray]:
    """`count` rounds of n peers' messages [n, size], each round's models a small step from the last."""
    rng = np.random.default_rng(3)
    models = rng.normal(0.0, 0.1, (n, size)).astype(np.float32)
    out = []
    for _ in range(count):
        models = models + rng.normal(0.0, 0.01, models.shape).astype(np.float32)
        out.append(models.copy())
    return out


@pytest.mark.parametrize("name", ATTACKS)
def test_each_attack_sends_what_its_rule_says_and_leaves_the_honest_rows(name):
    true = rounds_of_messages(attacks.STALE + 3)
    attackers, honest = [3, 4], [0, 1, 2]
    attack = Attack(name, attackers, 5, seed=0)
    for rnd, rows in enumerate(true):
        sent = rows.copy()
        attack.tamper(sent)
        np.testing.assert_array_equal(sent[honest], rows[honest])
        last = true[max(0, rnd - 1)]
        mean, last_mean = rows[honest].mean(0), last[honest].mean(0)
        expected = {
            "sign flip": last[attackers] - attacks.FLIP * (rows[attackers] - last[attackers]),
            "scaled": last[attackers] + attacks.SCALE * (rows[attackers] - last[attackers]),
            "alie": np.broadcast_to(mean - attacks.ALIE_Z * rows[honest].std(0), (2, 64)),
            "ipm": np.broadcast_to(last_mean - attacks.IPM_EPS * (mean - last_mean), (2, 64)),
            "stale": true[max(0, rnd - attacks.STALE)][attackers],
        }
        if name == "gaussian":
            noise = sent[attackers] - rows[attackers]
            assert abs(noise.std() - attacks.NOISE) < 0.2 and abs(noise.mean()) < 0.3  # 128 draws: ~3 sigma
        else:
            np.testing.assert_allclose(sent[attackers], expected[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ATTACKS)
def test_forge_gives_each_attacker_a_row_from_what_it_knows(name):
    # a real attacker (experiments/attack_peer.py): its own model and the two it received, shapes vary
    attack = Attack(name, [7], 8, seed=0)
    for rnd, rows in enumerate(rounds_of_messages(4, n=3)):
        own = rows[:1]
        forged = attack.forge(own, rows[: 1 + rnd % 3])
        assert forged.shape == own.shape and forged.dtype == np.float32 and np.isfinite(forged).all()


def test_none_and_bad_attackers():
    rows = rounds_of_messages(1)[0]
    sent = rows.copy()
    Attack("none", [4], 5, seed=0).tamper(sent)
    np.testing.assert_array_equal(sent, rows)
    with pytest.raises(ValueError, match="distinct ranks"):
        Attack("alie", [5], 5, seed=0)
    with pytest.raises(ValueError, match="no honest one"):
        Attack("alie", [0, 1], 2, seed=0)
    with pytest.raises(ValueError, match="one of"):
        Attack("flip", [1], 5, seed=0)


def test_receivers_merge_what_the_attack_made_of_the_round():
    """A virtual run's receivers get, from the attacker, the row the attack wrote, and from the
    others their true models: the run and the harness apply the attack through the same `tamper`."""
    args = parser().parse_args(["train", *JOB, "--steps", "24"])
    options = Options.from_args(args)
    settings = Settings(batch_size=32, steps=args.steps, eval_every=args.eval_every, step_s=0.002, eval_s=0.0)
    training = attacked_training("sign flip", [7])(options, settings, load(options.topology), mnist1d(args.samples),
                                                   lambda: make_model(args), "mlp-32")
    before: dict[int, np.ndarray] = {}  # round -> every peer's true model
    after: dict[int, np.ndarray] = {}   # round -> what the attack left of the round's messages
    tamper = training.attack.tamper

    def recording_tamper(rows: np.ndarray) -> None:
        before[len(before)] = rows.copy()
        tamper(rows)
        after[len(after)] = rows.copy()

    training.attack.tamper = recording_tamper
    merged = []
    plain = training.arrivals.plain

    def recording_plain(sender, receiver, msg_id, values, delivered, layer_delivered):
        merged.append((sender, msg_id, values.copy()))
        return plain(sender, receiver, msg_id, values, delivered, layer_delivered)

    training.arrivals.plain = recording_plain
    result = training.run()
    assert result["attack"]["attackers"] == [7] and result["rounds"] == len(before) == 6
    from_attacker = [(rnd, values) for sender, rnd, values in merged if sender == 7]
    assert from_attacker and len(from_attacker) < len(merged)
    for sender, rnd, values in merged:
        np.testing.assert_array_equal(values, after[rnd][sender])
        if sender != 7:
            np.testing.assert_array_equal(values, before[rnd][sender])
    assert any(not np.array_equal(values, before[rnd][7]) for rnd, values in from_attacker)


def test_ignored_attackers_reach_no_honest_model():
    """--ignore-attackers (the ideal defence): no honest receiver merges what rank 7 sends, and rank 7
    still merges the honest peers' messages."""
    args = parser().parse_args(["train", *JOB, "--steps", "24"])
    options = Options.from_args(args)
    settings = Settings(batch_size=32, steps=args.steps, eval_every=args.eval_every, step_s=0.002, eval_s=0.0)
    training = attacked_training("gaussian", [7], ignored=True)(options, settings, load(options.topology),
                                                                mnist1d(args.samples), lambda: make_model(args), "mlp-32")
    merged = []  # (sender, receiver) of every delivery merged
    plain = training.arrivals.plain

    def recording_plain(sender, receiver, msg_id, values, delivered, layer_delivered):
        merged.append((sender, receiver))
        return plain(sender, receiver, msg_id, values, delivered, layer_delivered)

    training.arrivals.plain = recording_plain
    result = training.run()
    assert result["attack"]["ignored"] and merged
    assert not [(s, r) for s, r in merged if s == 7]
    assert [(s, r) for s, r in merged if r == 7]


def test_the_cli_takes_the_attack_and_refuses_bad_ranks(tmp_path, capsys):
    out = tmp_path / "out.json"
    assert main(["train", *JOB, "--steps", "24", "--attack", "alie", "--attackers", "6-7", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["attack"]["name"] == "alie" and result["attack"]["attackers"] == [6, 7]
    assert 0.0 <= result["attack"]["honest_averaged_accuracy"] <= 1.0
    assert main(["train", *JOB, "--attack", "alie", "--attackers", "8"]) == 2
    assert "distinct ranks of the 8 peers" in capsys.readouterr().err
    assert main(["train", *JOB, "--attack", "alie"]) == 2
    assert "--attack and --attackers go together" in capsys.readouterr().err
    assert main(["train", *JOB, "--ignore-attackers"]) == 2
    assert "--ignore-attackers needs --attack" in capsys.readouterr().err
    assert main(["train", *JOB, "--attack", "alie", "--attackers", "7", "--compress", "int8"]) == 2
    assert "not simulated with --compress" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser().parse_args(["train", *JOB, "--attack", "alie", "--attackers", "x-7"])


@pytest.mark.slow  # ten small runs: ~5 s of CPU, over 20 s on a busy machine
def test_clip_bounds_every_attack_on_a_small_job():
    """8 peers, one attacker (rank 7): with --robust clip every attack leaves the honest peers within
    5 points of the clean run; the attacks that move a model far cost the plain merge far more."""
    clean, _ = honest_accuracy("none", "none")
    assert clean > 0.3  # the job learns: the comparison means something
    for name in ATTACKS:
        held, _ = honest_accuracy(name, "clip")
        assert held > clean - 0.05, name
    for name in ("sign flip", "scaled", "gaussian"):
        ruined, _ = honest_accuracy(name, "none")
        assert ruined < clean - 0.15, name
