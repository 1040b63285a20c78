"""Claim (issue 46): with --robust clip, one lying member in 8 (two in 16) costs the others little
accuracy, whatever it sends; without it, the table shows what each attack does.

    python experiments/attacks.py [--quick] [--seeds N] [--peers 8,16] [--sync bsp,ssp]
                                  [--modes none,clip,clip:1,clip+exclude,ideal] [--out DIR]

In virtual time (`p2plearn-sim train --attack A --attackers RANKS`), the setting of `sim_scale.py`
(heterogeneous tiers 25/50/100 Mbit/s, steady; i.i.d. shards; SELMCAST p=1; the MNIST-1D MLP,
hidden sim_scale.HIDDEN, a round every sim_scale.PERIOD steps, sim_scale.STEPS local steps). The
attackers are the last ranks (n/8 of them); each trains honestly, merges honestly, and sends, instead
of its model, what the attack makes of it each round (`p2plearn.sim.attacks`, which says what each
attack sends and how strong it is; experiments/attacks_sim.py runs the same attacks at 64 and 256 peers),
in BSP and in SSP with staleness 2 (--sync). The mode "ideal" is the defence no receiver has
(`--ignore-attackers`: the honest peers never merge what the attackers send), run once per table
(attack "any"): what the honest peers lose by training without the attackers' share of the work,
the floor the robust merge is measured against.
Accuracy: the mean over the honest ranks 0..EVAL_PEERS-1's own models at the end (and at each
evaluation); "final" is the honest models' average. Clipped: the share of the attackers' merges (at
their receivers) where most of the values were clipped, and the same share for honest senders.
Quick: 8 peers, BSP, sign flip and alie only, one seed.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common as c
import sim_scale as scale

from p2plearn.sim import attacks as attack_models
from p2plearn.sim.__main__ import main as sim_main

NAME = "attacks"
ATTACKS = ("none", *attack_models.ATTACKS)
IDEAL = "ideal"  # the ideal defence: the same whatever the attack, so one row per table, attack "any"
SYNC_FLAGS = {"bsp": ("--sync", "bsp"), "ssp": ("--sync", "ssp", "--staleness", "2")}


def run(tmp: Path, peers: int, attack: str, mode: str, seed: int, attackers: int | None = None,
        flags: tuple[str, ...] = ("--sync", "bsp"), steps: int = scale.STEPS) -> dict | None:
    """One `p2plearn-sim train` run; mode: a --robust value, with :RADIUS for --robust-radius (clip:1)
    and +exclude for --robust-exclude (clip+exclude), or IDEAL (--ignore-attackers; attack "any" sends
    the first of the attacks); `attackers`: how many of the last ranks attack (default n/8); `flags`:
    the sync mode's."""
    ideal = mode == IDEAL
    if ideal:
        mode, attack = "none", attack_models.ATTACKS[0] if attack == "any" else attack
    mode, plus, extra = mode.partition("+")
    if plus and extra != "exclude":
        raise ValueError(f"mode {mode}+{extra}: the only suffix is +exclude")
    robust, _, radius = mode.partition(":")
    count = 0 if attack == "none" else attackers or max(1, peers // 8)
    ranks = list(range(peers - count, peers))
    samples = max(12000, math.ceil(peers * 32 * 4 / 0.8))
    out = tmp / "run.json"
    argv = ["train", "--topology", str(scale.topology_file(tmp, peers, False)), "--compress", "none", *flags,
            "--selection", "selmcast",
            "--fanout", "1", "--period", str(scale.PERIOD), "--model", "mlp", "--hidden", str(scale.HIDDEN),
            "--steps", str(steps), "--samples", str(samples), "--eval-every", str(scale.EVAL_EVERY),
            "--eval-peers", str(min(scale.EVAL_PEERS, peers - count)), "--message-bytes", str(scale.MESSAGE_BYTES),
            "--seed", str(seed), "--robust", robust, *(["--robust-radius", radius] if radius else []),
            *(["--robust-exclude"] if plus else []),
            *(["--attack", attack, "--attackers", f"{ranks[0]}-{ranks[-1]}"] if count else []),
            *(["--ignore-attackers"] if ideal else []), "--json", str(out)]
    if sim_main(argv) != 0:
        return None
    r = json.loads(out.read_text())
    row = {"final_accuracy": r["attack"]["honest_averaged_accuracy"] if count else r["averaged_accuracy"],
           "own_accuracy_end": r["history"][-1][2] if r["history"] else math.nan,
           "history": [(t, mean) for t, _, mean in r["history"]], "virtual_s": r["virtual_s"], "wall_s": r["wall_s"],
           "parameters": r["parameters"], "attackers": ranks, **c.compute_clock(r)}
    if "robust" in r:
        senders = {int(k): v for k, v in r["robust"]["senders"].items()}
        share = (lambda who: sum(senders.get(s, {}).get("clipped", 0) for s in who) /
                 max(1, sum(senders.get(s, {}).get("merges", 0) for s in who)))
        row["attackers_clipped"] = share(ranks) if count else math.nan
        row["honest_clipped"] = share(range(peers - count))
    return row


def extra_flags(ap) -> None:
    ap.add_argument("--peers", default="8,16", help="comma-separated sizes; n/8 attackers (default: %(default)s)")
    ap.add_argument("--sync", default="bsp,ssp", help=f"comma-separated sync modes, of {', '.join(SYNC_FLAGS)} "
                    "(SSP: staleness 2) (default: %(default)s)")
    ap.add_argument("--modes", default=f"none,clip,clip:1,clip+exclude,{IDEAL}",
                    help="--robust values compared, :R for --robust-radius R, +exclude for --robust-exclude, "
                         f"{IDEAL} for the attackers ignored from the start (default: %(default)s)")


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv, extra=extra_flags)
    os.chdir(c.ROOT)
    sizes = [8] if args.quick else [int(x) for x in args.peers.split(",")]
    syncs = ["bsp"] if args.quick else args.sync.split(",")
    if unknown := set(syncs) - set(SYNC_FLAGS):
        raise SystemExit(f"attacks.py: --sync {args.sync}: not a sync mode: {', '.join(sorted(unknown))}")
    attacks = ("none", "sign flip", "alie") if args.quick else ATTACKS
    modes = args.modes.split(",")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows: list[c.Row] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="p2psim-") as tmp:
        for n in sizes:
            for sync in syncs:
                pairs = [(a, m) for a in attacks for m in modes if m != IDEAL]
                for attack, robust in pairs + ([("any", IDEAL)] if IDEAL in modes else []):
                    cfg = {"peers": n, "sync": sync, "attack": attack, "robust": robust}
                    rows += c.repeat(cfg, args.seeds, lambda seed, cfg=cfg: run(
                        Path(tmp), cfg["peers"], cfg["attack"], cfg["robust"], seed, flags=SYNC_FLAGS[cfg["sync"]]))
    print(f"{len(rows)} runs in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    tables, verdicts = [], []
    for (n, sync), group in c.groups(rows, ["peers", "sync"]).items():
        tables.append(f"**{n} peers, {max(1, n // 8)} attacker(s), {sync}**\n\n" + c.table(
            group, ["attack", "robust"],
            {"honest own accuracy (end)": c.metric("own_accuracy_end"),
             "honest average's accuracy": c.metric("final_accuracy"),
             "attackers' merges clipped": c.metric("attackers_clipped"),
             "honest merges clipped": c.metric("honest_clipped"), "virtual s": c.metric("virtual_s")}))

        def accuracy(attack: str, mode: str) -> float:
            return c.summary(r["own_accuracy_end"] for r in group if r["ok"] and r["attack"] == attack
                             and r["robust"] == mode)[0]

        clean = {m: accuracy("none", m) for m in modes if m != IDEAL}
        ideal = accuracy("any", IDEAL) if IDEAL in modes else math.nan
        if not math.isnan(ideal):
            verdicts.append(f"- {n} peers, {sync}, ideal defence (the attackers ignored from the start): {ideal:.3f} "
                            f"({(ideal - clean.get('none', math.nan)) * 100:+.1f} points from the clean plain run): "
                            "the floor")
        for m in clean:
            worst = min(((accuracy(a, m), a) for a in attacks if a != "none"), default=None)
            if worst:
                baseline = clean.get("none", clean[m])  # the plain merge's clean run, where it was run
                versus_ideal = "" if math.isnan(ideal) else f", {(worst[0] - ideal) * 100:+.1f} from the ideal defence"
                verdicts.append(f"- {n} peers, {sync}, --robust {m}: without attackers {clean[m]:.3f}; worst attack "
                                f"{worst[1]}: {worst[0]:.3f} ({(worst[0] - baseline) * 100:+.1f} points from the clean "
                                f"plain run{versus_ideal})")
    setup = (f"Commit {commit}; `python experiments/attacks.py {' '.join(argv if argv is not None else sys.argv[1:])}`. "
             f"Virtual time (`p2plearn.sim`), MNIST-1D MLP hidden {scale.HIDDEN} ({rows[0].get('parameters', '?')} "
             f"parameters), a message {scale.MESSAGE_BYTES / 1e6:g} MB on the simulated network, "
             f"{' and '.join(s.upper() + (' (staleness 2)' if s == 'ssp' else '') for s in syncs)}, SELMCAST p=1, a "
             f"round every {scale.PERIOD} steps, {scale.STEPS} local steps, batch 32, SGD lr 0.1 momentum 0.9, i.i.d., "
             f"heterogeneous tiers 25/50/100 Mbit/s, steady; {args.seeds} seed(s). Attacks: "
             f"{attack_models.describe()}; clip: --robust clip at the default --robust-radius 2, clip:1 at 1, "
             f"clip+exclude with --robust-exclude; ideal: the attackers ignored from the start (--ignore-attackers), "
             f"the same whatever they send. Cells: median [min-max] over seeds. "
             f"Virtual times do not depend on the host's load. " + c.load_note(rows))

    def draw(ax) -> None:
        draw_curves(ax, [r for r in rows if r["ok"] and r["seed"] == 0 and (r["peers"], r["sync"]) == (sizes[0], syncs[0])],
                    f"{sizes[0]} peers, {max(1, sizes[0] // 8)} attacker(s), {syncs[0]}, seed 0")

    c.write_results(args.out, NAME, rows, "Lying members: attacks against the plain and the robust merge", setup,
                    "\n\n".join(tables), draw, notes="\n".join(verdicts))


def draw_curves(ax, shown: list[c.Row], title: str) -> None:
    """The honest peers' accuracy over virtual time of each run in `shown` (dotted: the plain merge)."""
    for r in shown:
        t, a = zip(*r["history"])
        ax.plot(t, a, label=f"{r['attack']}, --robust {r['robust']}", linestyle="-" if r["robust"] != "none" else ":")
    ax.set_xlabel("virtual seconds")
    ax.set_ylabel("honest peers' mean test accuracy")
    ax.set_title(title)
    ax.legend(fontsize=6)


if __name__ == "__main__":
    sys.exit(main())
