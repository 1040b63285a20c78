"""Claim (issue 46): with --robust clip, one lying member in 8 costs the others at most 0.05 nats of
validation loss on the transformer, whatever it sends; without it, the table shows what each attack does.

    python experiments/attacks_transformer.py [--quick] [--seeds N] [--sync bsp,ssp] [--peers N]
                                              [--modes none,clip] [--name NAME] [--out DIR]

Real training (`p2plearn.launch -np N --emulate`, N = 8 by default, the heterogeneous tiers of
sim_scale.py: 25/50/100 Mbit/s, steady), every peer `experiments/attack_peer.py` around
`p2plearn.examples.charlm`: the last N // 8 ranks attack (1 in 8, 2 in 16), the others are honest.
The transformer is small so that 8 peers share 2 cores in minutes (LAYERS layers, dim DIM, HEADS
heads, context 64, batch 8, AdamW lr 1e-3; 42 jobs per sync mode at 3 seeds: about 1 h at 8 peers),
STEPS local steps, a round every PERIOD, SELMCAST p=1, float32 messages (--compress none, as the
virtual attacks). The attacks are experiments/attacks.py's (`p2plearn.sim.attacks`), but an attacker
knows only its own model and what it receives (attack_peer.py says what that changes for alie and ipm).
Loss: each honest rank's own model's validation loss at the end (64 windows), their mean and their
worst; "clean" rows have no attacker. Quick: BSP, none and sign flip, one seed, 80 steps.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common as c
import sim_scale as scale

from p2plearn.sim import attacks as attack_models

NAME = "attacks_transformer"
PEERS = 8  # the default; one attacker per 8 peers
LAYERS, DIM, HEADS = 2, 96, 4
STEPS, PERIOD = 200, 4
ATTACKS = ("none", *attack_models.ATTACKS)
SYNC_FLAGS = {"bsp": ["--sync", "bsp"], "ssp": ["--sync", "ssp", "--staleness", "2"]}
OWN_LOSS = re.compile(r"rank (\d+) done: own model validation loss ([0-9.]+|nan|inf)")
PARAMETERS = re.compile(r"([0-9.]+)M parameters")


def attackers_of(peers: int) -> list[int]:
    """The attacking ranks of a job of ``peers``: the last ``peers // 8`` (at least one)."""
    return list(range(peers - max(1, peers // 8), peers))


def run(tmp: Path, attack: str, robust: str, sync: str, seed: int, steps: int, peers: int = PEERS) -> c.Row | None:
    """One job: `attackers_of(peers)` run `attack` ("none": every rank honest); the honest ranks' own losses."""
    out = tmp / "result.json"
    out.unlink(missing_ok=True)
    attackers = attackers_of(peers)
    argv = [c.PY, "-m", "p2plearn.launch", "-np", str(peers), "--topology", str(scale.topology_file(tmp, peers, False)),
            "--emulate", "--", c.PY, str(c.ROOT / "experiments" / "attack_peer.py"), "--attack", attack,
            "--attackers", f"{attackers[0]}-{attackers[-1]}", "--seed", str(seed), "--",
            "-m", "p2plearn.examples.charlm", "--layers", str(LAYERS), "--dim", str(DIM), "--heads", str(HEADS),
            "--steps", str(steps), "--period", str(PERIOD), "--eval-every", str(steps), "--seed", str(seed),
            "--compress", "none", "--selection", "selmcast", "--fanout", "1", "--robust", robust,
            *SYNC_FLAGS[sync], "--json", str(out)]
    try:
        proc = subprocess.run(argv, cwd=c.ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                              text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        print("  timed out after 1800 s", file=sys.stderr)
        return None
    losses = {int(r): float(x) for r, x in OWN_LOSS.findall(proc.stdout)}
    parameters = PARAMETERS.search(proc.stdout)
    if proc.returncode or not out.exists() or len(losses) != peers or not parameters:
        print(f"  failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-1500:]}", file=sys.stderr)
        return None
    honest = [loss for r, loss in losses.items() if r not in attackers or attack == "none"]
    result = json.loads(out.read_text())
    return {"honest_loss": sum(honest) / len(honest), "worst_honest_loss": max(honest),
            "averaged_loss": result["averaged_loss"], "wall_s": result["wall_s"], "rounds": result["rounds"],
            "parameters_m": float(parameters.group(1))}


def extra_flags(ap) -> None:
    ap.add_argument("--sync", default="bsp", help=f"comma-separated, of {', '.join(SYNC_FLAGS)} (SSP: staleness "
                    "2) (default: %(default)s)")
    ap.add_argument("--modes", default="none,clip", help="--robust values compared (default: %(default)s)")
    ap.add_argument("--peers", type=int, default=PEERS, help="peers per job, 8 or more; 1 attacker per 8 "
                    "(default: %(default)s)")
    ap.add_argument("--name", default=NAME, type=c.results_name,
                    help="the results files' name (default: %(default)s)")


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv, extra=extra_flags)
    syncs = ["bsp"] if args.quick else args.sync.split(",")
    if unknown := set(syncs) - set(SYNC_FLAGS):
        raise SystemExit(f"attacks_transformer.py: --sync {args.sync}: not a sync mode: {', '.join(sorted(unknown))}")
    if args.peers < 8:
        raise SystemExit(f"attacks_transformer.py: --peers {args.peers}: at least 8 (one attacker per 8)")
    attacks = ("none", "sign flip") if args.quick else ATTACKS
    modes, steps = args.modes.split(","), 80 if args.quick else STEPS
    rows: list[c.Row] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="p2patt-") as tmp:
        for sync in syncs:
            for attack in attacks:
                for robust in modes:
                    cfg = {"sync": sync, "attack": attack, "robust": robust}
                    rows += c.repeat(cfg, args.seeds, lambda seed, cfg=cfg: run(
                        Path(tmp), cfg["attack"], cfg["robust"], cfg["sync"], seed, steps, args.peers))
    print(f"{len(rows)} runs in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    tables, verdicts = [], []
    attackers = attackers_of(args.peers)
    who = f"{args.peers} peers, {len(attackers)} attacker{'s' if len(attackers) > 1 else ''}"
    attacking = (f"rank {attackers[0]} attacks" if len(attackers) == 1 else
                 f"ranks {', '.join(map(str, attackers))} attack")
    for (sync,), group in c.groups(rows, ["sync"]).items():
        tables.append(f"**{who}, {sync}**\n\n" + c.table(
            group, ["attack", "robust"],
            {"honest ranks' loss (mean)": c.metric("honest_loss"), "worst honest rank": c.metric("worst_honest_loss"),
             "averaged model's loss": c.metric("averaged_loss"), "wall s": c.metric("wall_s")}, fmt=".3f"))
        clean = c.summary(r["honest_loss"] for r in group if r["ok"] and r["attack"] == "none" and r["robust"] == "none")[0]
        for m in modes:
            worst = max(((c.summary(r["honest_loss"] for r in group if r["ok"] and r["attack"] == a
                                    and r["robust"] == m)[0], a) for a in attacks if a != "none"), default=None)
            if worst:
                verdicts.append(f"- {sync}, --robust {m}: worst attack {worst[1]}: honest loss {worst[0]:.3f}, "
                                f"{worst[0] - clean:+.3f} nats from the clean plain run ({clean:.3f})")
    parameters = next((r["parameters_m"] for r in rows if r["ok"]), "?")
    setup = (f"`python experiments/attacks_transformer.py {' '.join(argv if argv is not None else sys.argv[1:])}`. "
             f"Real training on this host's loopback ({args.peers} processes on {os.cpu_count()} cores, `--emulate` "
             f"heterogeneous tiers 25/50/100 Mbit/s, steady): p2plearn.examples.charlm with {LAYERS} layers, dim "
             f"{DIM}, {HEADS} heads ({parameters}M parameters), {steps} local steps, batch 8, AdamW lr 1e-3, a round every "
             f"{PERIOD} steps, SELMCAST p=1, --compress none, {' and '.join(s.upper() for s in syncs)}; {attacking} "
             f"(experiments/attack_peer.py: {attack_models.describe()}; alie and ipm from its "
             f"own model and the whole messages it received); {args.seeds} seed(s). Losses: the honest ranks' own "
             f"models' validation loss at the end, in nats; cells: median [min-max] over seeds. " + c.load_note(rows))

    def draw(ax) -> None:
        ok = [r for r in rows if r["ok"]]
        c.bar_chart(ax, ok, ["attack", "robust"], lambda r: r["honest_loss"], "honest ranks' validation loss (nats)",
                    f"{who}, {' and '.join(syncs)}")

    c.write_results(args.out, args.name, rows, "Lying members on a transformer: attacks against the plain and the robust "
                    "merge", setup, "\n\n".join(tables), draw, notes="\n".join(verdicts))


if __name__ == "__main__":
    main()
