"""Claim (issue 46): with --robust clip, one lying member in 8 (two in 16) costs the others little
accuracy, whatever it sends; without it, the table shows what each attack does.

    python experiments/attacks.py [--quick] [--seeds N] [--peers 8,16] [--modes none,clip,clip:1] [--out DIR]

In virtual time (`p2plearn.sim`), the setting of `sim_scale.py` (heterogeneous tiers 25/50/100 Mbit/s,
steady; i.i.d. shards; BSP, SELMCAST p=1; the MNIST-1D MLP, hidden sim_scale.HIDDEN, a round every
sim_scale.PERIOD steps, sim_scale.STEPS local steps). The attackers are the last ranks (n/8 of them);
each trains honestly, merges honestly, and sends, instead of its model, what the attack makes of it
each round (the others' models are known to it: the strongest attacker of the literature):
- sign flip: its own model's change since its last round, reversed and scaled by FLIP;
- scaled: that change scaled by SCALE;
- gaussian: its model plus N(0, NOISE^2) per value;
- alie ("a little is enough", Baruch et al. 2019): the honest models' mean minus ALIE_Z standard
  deviations, per value (inside the honest spread, so that it escapes outlier tests);
- ipm (inner-product manipulation, Xie et al. 2020): the honest mean's last round minus IPM_EPS
  times the honest mean's change since (the update the others agree on, reversed);
- stale: its model of STALE rounds ago.
Accuracy: the mean over the honest ranks 0..EVAL_PEERS-1's own models at the end (and at each
evaluation); "final" is the honest models' average. Clipped: the share of the attackers' merges (at
their receivers) where most of the values were clipped, and the same share for honest senders.
Quick: 8 peers, sign flip and alie only, one seed.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import common as c
import sim_scale as scale

NAME = "attacks"
ATTACKS = ("none", "sign flip", "scaled", "gaussian", "alie", "ipm", "stale")
FLIP = 10.0      # sign flip: the change reversed, x10
SCALE = 10.0     # scaled: the change x10
NOISE = 1.0      # gaussian: the noise's standard deviation per value (the MLP's weights are ~0.1)
ALIE_Z = 1.0     # alie: standard deviations below the honest mean
IPM_EPS = 4.0    # ipm: the honest mean change, reversed, x4
STALE = 10       # stale: rounds behind


def attacked_training(attack: str, attackers: list[int]):
    """A `VirtualTraining` whose `attackers` send what `attack` makes of their models (see the doc)."""
    from p2plearn.sim.train import VirtualTraining

    class Attacked(VirtualTraining):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.rng = np.random.default_rng(self.settings.seed + 7)
            self.honest = [i for i in range(self.n) if i not in attackers]
            self.sent_rounds: dict[int, np.ndarray] = {}  # round -> every peer's true message (before tampering)

        def _merge(self, pending, taken, messages, anchors):
            for rnd in sorted({int(r) for r in pending["round"][taken]}):
                if rnd not in self.sent_rounds:
                    self._tamper(rnd, messages[rnd])
            super()._merge(pending, taken, messages, anchors)

        def _tamper(self, rnd: int, rows: np.ndarray) -> None:
            true = rows.copy()
            self.sent_rounds[rnd] = true
            self.sent_rounds.pop(rnd - STALE - 1, None)
            last = self.sent_rounds.get(rnd - 1, true)
            mean, last_mean = true[self.honest].mean(0), last[self.honest].mean(0)
            for a in attackers:
                if attack == "sign flip":
                    rows[a] = last[a] - FLIP * (true[a] - last[a])
                elif attack == "scaled":
                    rows[a] = last[a] + SCALE * (true[a] - last[a])
                elif attack == "gaussian":
                    rows[a] = true[a] + self.rng.normal(0.0, NOISE, true[a].size).astype(np.float32)
                elif attack == "alie":
                    rows[a] = mean - ALIE_Z * true[self.honest].std(0)
                elif attack == "ipm":
                    rows[a] = last_mean - IPM_EPS * (mean - last_mean)
                elif attack == "stale":
                    rows[a] = self.sent_rounds[min(self.sent_rounds)][a]

    return Attacked


def run(tmp: Path, peers: int, attack: str, mode: str, seed: int) -> dict | None:
    """One virtual run; mode: a --robust value, with :RADIUS for --robust-radius (clip:1)."""
    from p2plearn.examples.mnist1d import make_model
    from p2plearn.options import Options
    from p2plearn.sim.__main__ import parser
    from p2plearn.sim.train import Settings
    from p2plearn.topology import load
    from p2plearn.train.data import mnist1d

    robust, _, radius = mode.partition(":")
    attackers = list(range(peers - max(1, peers // 8), peers)) if attack != "none" else []
    samples = max(12000, math.ceil(peers * 32 * 4 / 0.8))
    argv = ["train", "--topology", str(scale.topology_file(tmp, peers, False)), "--sync", "bsp", "--selection",
            "selmcast", "--fanout", "1", "--period", str(scale.PERIOD), "--model", "mlp", "--hidden",
            str(scale.HIDDEN), "--steps", str(scale.STEPS), "--samples", str(samples), "--eval-every",
            str(scale.EVAL_EVERY), "--eval-peers", str(min(scale.EVAL_PEERS, peers - len(attackers))),
            "--message-bytes", str(scale.MESSAGE_BYTES), "--seed", str(seed), "--robust", robust,
            *(["--robust-radius", radius] if radius else [])]
    args = parser().parse_args(argv)
    torch.set_num_threads(1)
    options = Options.from_args(args)
    settings = Settings(batch_size=args.batch_size, lr=args.lr, steps=args.steps, seed=seed,
                        eval_every=args.eval_every, eval_peers=args.eval_peers, message_bytes=args.message_bytes)
    training = attacked_training(attack, attackers)(options, settings, load(options.topology), mnist1d(args.samples),
                                                    lambda: make_model(args), f"mlp-{scale.HIDDEN}")
    r = training.run()
    honest = [i for i in range(peers) if i not in attackers]
    final = training.replicas.accuracy(training.replicas.flat[honest].mean(0), training.data.x_test,
                                       training.data.y_test)
    row = {"final_accuracy": final, "own_accuracy_end": r["history"][-1][2] if r["history"] else math.nan,
           "history": [(t, mean) for t, _, mean in r["history"]], "virtual_s": r["virtual_s"], "wall_s": r["wall_s"],
           "parameters": r["parameters"], "attackers": attackers}
    if "robust" in r:
        senders = r["robust"]["senders"]
        share = (lambda who: sum(senders.get(s, {}).get("clipped", 0) for s in who) /
                 max(1, sum(senders.get(s, {}).get("merges", 0) for s in who)))
        row["attackers_clipped"] = share(attackers) if attackers else math.nan
        row["honest_clipped"] = share(honest)
    return row


def extra_flags(ap) -> None:
    ap.add_argument("--peers", default="8,16", help="comma-separated sizes; n/8 attackers (default: %(default)s)")
    ap.add_argument("--modes", default="none,clip,clip:1",
                    help="--robust values compared, :R for --robust-radius R (default: %(default)s)")


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv, extra=extra_flags)
    os.chdir(c.ROOT)
    sizes = [8] if args.quick else [int(x) for x in args.peers.split(",")]
    attacks = ("none", "sign flip", "alie") if args.quick else ATTACKS
    modes = args.modes.split(",")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows: list[c.Row] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="p2psim-") as tmp:
        for n in sizes:
            for attack in attacks:
                for robust in modes:
                    cfg = {"peers": n, "attack": attack, "robust": robust}
                    rows += c.repeat(cfg, args.seeds,
                                     lambda seed, cfg=cfg: run(Path(tmp), n, cfg["attack"], cfg["robust"], seed))
    print(f"{len(rows)} runs in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    tables, verdicts = [], []
    for (n,), group in c.groups(rows, ["peers"]).items():
        tables.append(f"**{n} peers, {max(1, n // 8)} attacker(s)**\n\n" + c.table(
            group, ["attack", "robust"],
            {"honest own accuracy (end)": c.metric("own_accuracy_end"),
             "honest average's accuracy": c.metric("final_accuracy"),
             "attackers' merges clipped": c.metric("attackers_clipped"),
             "honest merges clipped": c.metric("honest_clipped"), "virtual s": c.metric("virtual_s")}))
        clean = {m: c.summary(r["own_accuracy_end"] for r in group if r["ok"] and r["attack"] == "none"
                              and r["robust"] == m)[0] for m in modes}
        for m in modes:
            worst = min(((c.summary(r["own_accuracy_end"] for r in group if r["ok"] and r["attack"] == a
                                    and r["robust"] == m)[0], a) for a in attacks if a != "none"), default=None)
            if worst:
                verdicts.append(f"- {n} peers, --robust {m}: without attackers {clean[m]:.3f}; worst attack "
                                f"{worst[1]}: {worst[0]:.3f} ({(worst[0] - clean['none' if 'none' in clean else m]) * 100:+.1f} "
                                f"points from the clean plain run)")
    setup = (f"Commit {commit}; `python experiments/attacks.py {' '.join(argv if argv is not None else sys.argv[1:])}`. "
             f"Virtual time (`p2plearn.sim`), MNIST-1D MLP hidden {scale.HIDDEN} ({rows[0].get('parameters', '?')} "
             f"parameters), a message {scale.MESSAGE_BYTES / 1e6:g} MB on the simulated network, BSP, SELMCAST p=1, a "
             f"round every {scale.PERIOD} steps, {scale.STEPS} local steps, batch 32, SGD lr 0.1 momentum 0.9, i.i.d., "
             f"heterogeneous tiers 25/50/100 Mbit/s, steady; {args.seeds} seed(s). Attacks: sign flip x{FLIP:g}, "
             f"scaled x{SCALE:g}, gaussian sigma {NOISE:g}, alie z {ALIE_Z:g}, ipm eps {IPM_EPS:g}, stale "
             f"{STALE} rounds; clip: --robust clip at the default --robust-radius 2, clip:1 at 1. Cells: median [min-max] over seeds. "
             f"Virtual times do not depend on the host's load. " + c.load_note(rows))

    def draw(ax) -> None:
        shown = [r for r in rows if r["ok"] and r["seed"] == 0 and r["peers"] == sizes[0]]
        for r in shown:
            t, a = zip(*r["history"])
            ax.plot(t, a, label=f"{r['attack']}, --robust {r['robust']}",
                    linestyle="-" if r["robust"] != "none" else ":")
        ax.set_xlabel("virtual seconds")
        ax.set_ylabel("honest peers' mean test accuracy")
        ax.set_title(f"{sizes[0]} peers, {max(1, sizes[0] // 8)} attacker(s), seed 0")
        ax.legend(fontsize=6)

    c.write_results(args.out, NAME, rows, "Lying members: attacks against the plain and the robust merge", setup,
                    "\n\n".join(tables), draw, notes="\n".join(verdicts))


if __name__ == "__main__":
    sys.exit(main())
