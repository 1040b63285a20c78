"""Lying members in virtual time: what an attacking peer sends instead of its model.

    p2plearn-sim train ... --attack "sign flip" --attackers 60-63 --robust clip

An attacker trains and merges honestly, and each round sends, instead of its model, what the attack
makes of it. It knows every honest peer's model of the round (the strongest attacker of the
literature, the one ClippedGossip and BTARD are measured against):
- sign flip: its own model's change since its last round, reversed and scaled by FLIP;
- scaled: that change scaled by SCALE;
- gaussian: its model plus N(0, NOISE^2) per value;
- alie ("a little is enough", Baruch et al. 2019): the honest models' mean minus ALIE_Z standard
  deviations, per value (inside the honest spread, so that it escapes outlier tests);
- ipm (inner-product manipulation, Xie et al. 2020): the honest mean's last round minus IPM_EPS
  times the honest mean's change since (the update the others agree on, reversed);
- stale: its model of STALE rounds ago (its first round's until it has that many).
The strengths are the ones experiments/attacks.py measured at 8 and 16 peers; tune them here (a
larger FLIP, SCALE or NOISE moves the attacker further, which clipping catches more easily; a larger
ALIE_Z leaves the honest spread).

`Attack` rewrites the attacker rows of one round's messages; `attacked_training` is a
`VirtualTraining` whose rounds go through it (the experiments and `p2plearn-sim train --attack` both
use it). The attackers should be the last ranks, so that `--eval-peers` evaluates honest ones.
`--ignore-attackers` is the ideal defence, which no real receiver has: the honest peers know the
attackers from the start and never merge what they send (their links still carry it). It is the floor
a robust merge is measured against: what the honest peers lose by training without the attackers'
share of the work, whatever the attack.
"""
from __future__ import annotations

import argparse
from collections import deque

import numpy as np

from p2plearn.sim.train import VirtualTraining

ATTACKS = ("sign flip", "scaled", "gaussian", "alie", "ipm", "stale")
FLIP = 10.0      # sign flip: the change reversed, x10
SCALE = 10.0     # scaled: the change x10
NOISE = 1.0      # gaussian: the noise's standard deviation per value (the MLP's weights are ~0.1)
ALIE_Z = 1.0     # alie: standard deviations below the honest mean
IPM_EPS = 4.0    # ipm: the honest mean change, reversed, x4
STALE = 10       # stale: rounds behind


def describe() -> str:
    """The attacks' strengths in one line (results files and the JSON result quote it)."""
    return (f"sign flip x{FLIP:g}, scaled x{SCALE:g}, gaussian sigma {NOISE:g}, alie z {ALIE_Z:g}, ipm eps "
            f"{IPM_EPS:g}, stale {STALE} rounds")


class Attack:
    """One attack by `attackers` (ranks of n peers): `tamper` rewrites their rows of each round's
    messages. "none" leaves every message as it is. Noise is drawn from a generator seeded `seed`."""

    def __init__(self, name: str, attackers: list[int], n: int, seed: int) -> None:
        if name not in ("none", *ATTACKS):
            raise ValueError(f"--attack {name!r}: one of {', '.join(ATTACKS)}")
        if any(not 0 <= a < n for a in attackers) or len(set(attackers)) != len(attackers):
            raise ValueError(f"--attackers {attackers}: distinct ranks of the {n} peers")
        if name != "none" and len(attackers) >= n:
            raise ValueError(f"--attackers: {len(attackers)} of {n} peers leaves no honest one")
        self.name, self.attackers = name, list(attackers)
        self.honest = np.setdiff1d(np.arange(n), self.attackers)
        self.rng = np.random.default_rng(seed)
        # the previous round's true messages: the attackers' rows and the honest mean (None before round 0)
        self._last: tuple[np.ndarray, np.ndarray] | None = None
        # the attackers' true rows of the last STALE + 1 rounds, oldest first (stale)
        self._history: deque[np.ndarray] = deque(maxlen=STALE + 1)

    def tamper(self, rows: np.ndarray) -> None:
        """Rewrite the attackers' rows of one round's messages (rows [n, P], every peer's true model
        of the round) in place with what the attack sends. Called once per round, rounds in order."""
        if self.name == "none" or not self.attackers:
            return
        rows[self.attackers] = self.forge(rows[self.attackers], rows[self.honest])

    def forge(self, true: np.ndarray, honest: np.ndarray) -> np.ndarray:
        """What the attackers send this round instead of their true models (true [a, P]), knowing the
        honest models `honest` [h, P] (all of them here; a real attacker passes what it received and
        its own: experiments/attack_peer.py); [a, P], every attacker's row. Called once per round, rounds
        in order."""
        true, mean = true.copy(), honest.mean(0)
        last, last_mean = self._last if self._last is not None else (true, mean)
        self._last = (true, mean)
        self._history.append(true)
        if self.name == "sign flip":
            return last - FLIP * (true - last)
        if self.name == "scaled":
            return last + SCALE * (true - last)
        if self.name == "gaussian":
            return true + self.rng.normal(0.0, NOISE, true.shape).astype(np.float32)
        if self.name == "alie":
            return np.broadcast_to(mean - ALIE_Z * honest.std(0), true.shape)
        if self.name == "ipm":
            return np.broadcast_to(last_mean - IPM_EPS * (mean - last_mean), true.shape)
        return self._history[0]  # stale


def attacked_training(attack: str, attackers: list[int], ignored: bool = False) -> type[VirtualTraining]:
    """A `VirtualTraining` whose `attackers` send what `attack` makes of their models (`Attack`); its
    result adds "attack": the attack, the attackers, the strengths, whether they were `ignored` (the
    ideal defence: honest receivers drop their deliveries unmerged) and the honest models' average's
    accuracy (the run's averaged_accuracy counts the attackers' models)."""

    class Attacked(VirtualTraining):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            if attack != "none" and (self.messages is not None or self.options.sync == "partitioned"):
                raise ValueError("--attack: rewrites plain float32 messages; not simulated with --compress "
                                 "(add --compress none), --filter value or --sync partitioned")
            self.attack = Attack(attack, attackers, self.n, self.settings.seed + 7)
            self._tampered = -1  # the last round whose messages went through the attack

        def _merge(self, current, pending, taken, messages, anchors) -> None:
            # a round's messages are complete once its round has started; the first merge after
            # it is the earliest any receiver can take them
            for rnd in sorted(r for r in messages if r > self._tampered):
                self.attack.tamper(messages[rnd])
                self._tampered = rnd
            if ignored:
                from_attacker = np.isin(pending["src"], attackers) & ~np.isin(pending["dst"], attackers)
                taken = taken & ~from_attacker
            super()._merge(current, pending, taken, messages, anchors)

        def _run(self, progress) -> dict:
            result = super()._run(progress)
            honest = self.replicas.flat[self.attack.honest].mean(0)
            result["attack"] = {"name": attack, "attackers": list(attackers), "strengths": describe(),
                                "ignored": ignored,
                                "honest_averaged_accuracy": self.replicas.accuracy(honest, self.data.x_test,
                                                                                   self.data.y_test)}
            return result

    return Attacked


def parse_ranks(text: str) -> list[int]:
    """Ranks written as "60,61" or "60-63" (or both, comma-separated); a clear error otherwise."""
    ranks: list[int] = []
    try:
        for part in filter(None, text.split(",")):
            first, _, last = part.partition("-")
            ranks += list(range(int(first), int(last or first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: ranks such as 7 or 60-63,70") from None
    return ranks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`p2plearn-sim train`'s attack flags (docs/simulator.md)."""
    group = parser.add_argument_group("lying members (p2plearn.sim.attacks)")
    group.add_argument("--attack", choices=ATTACKS, default=None,
                       help=f"what the --attackers send instead of their models each round ({describe()}; "
                            "default: none)")
    group.add_argument("--attackers", type=parse_ranks, default=None, metavar="RANKS",
                       help="the attacking ranks, e.g. 60-63; the last ranks keep --eval-peers honest (default: none)")
    group.add_argument("--ignore-attackers", action="store_true",
                       help="the ideal defence: honest peers never merge what the attackers send (the floor a "
                            "robust merge is measured against)")
