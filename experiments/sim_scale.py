"""Claim (the seeds' SELMCAST claim, at scale): SELMCAST's rounds are shorter than random-p's at a
similar or larger average p, so it reaches a target accuracy sooner, at 16 to 256 peers.

    python experiments/sim_scale.py [--quick] [--report] [--seeds N] [--peers 16,64,256] [--name NAME] [--out DIR]

In virtual time (`p2plearn-sim train`): heterogeneous tiers (downlinks 25/50/100 Mbit/s, uplinks 1
or 0.5 of them: heterogeneous-16's mix, generated for each size), steady and with a quarter of the
peers bursting (downlink to 0.1x for 2 s every 10 s); i.i.d. and Dirichlet 0.1 shards; BSP and SSP
s=2 x SELMCAST p=1, random p = 1, 2, 3, all (up to 64 peers) and the exponential graph (p=1); a round every PERIOD
steps, STEPS local steps, 3 seeds. The replica is a small MLP (MNIST-1D, hidden HIDDEN) whose
message occupies MESSAGE_BYTES on the network (`--message-bytes`: a model of ~250k parameters), so
the network, not the 2-core host, sets the pace. Time to target: the first evaluation (every
EVAL_EVERY steps) at which the mean test accuracy of ranks 0..EVAL_PEERS-1 reaches the target,
fixed from seed 0's curves by selmcast_vs_random's rule. Ratio: SELMCAST's median / the best
random-p's (lowest median) in the same setting. Quick: 16 peers, steady, i.i.d., BSP, one seed.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import common as c
import selmcast_vs_random as svr

from p2plearn.sim.__main__ import main as sim_main
from p2plearn.topology import heterogeneous, save

NAME = "sim_scale"
HIDDEN = 128
MESSAGE_BYTES = 1e6
PERIOD = 4
STEPS = 160
EVAL_EVERY = 8
EVAL_PEERS = 8
SELECTIONS = [("selmcast", 1), ("random", 1), ("random", 2), ("random", 3), ("all", 1), ("exponential", 1)]
SYNCS = [("bsp", 0), ("ssp", 2)]
ALL_UP_TO = 64


def selections(n: int) -> list[tuple[str, int]]:
    """The policies compared at n peers: `all` only up to ALL_UP_TO (beyond, its rounds carry n - 1
    messages into every downlink, minutes each at these rates, and its merges alone take most of a
    run's wall time)."""
    return [s for s in SELECTIONS if s[0] != "all" or n <= ALL_UP_TO]


def topology_file(tmp: Path, n: int, bursts: bool) -> Path:
    path = tmp / f"heterogeneous-{n}{'-bursts' if bursts else ''}.json"
    if not path.exists():
        save(heterogeneous(n, tiers=(25.0, 50.0, 100.0), up_ratios=(1.0, 0.5), bursty=n // 4 if bursts else 0), path)
    return path


def run(tmp: Path, cfg: dict, seed: int) -> dict:
    return virtual_run(tmp, topology_file(tmp, cfg["peers"], cfg["bursts"]), cfg["peers"], seed,
                       ["--sync", cfg["sync"], "--staleness", str(cfg["staleness"]), "--selection", cfg["selection"],
                        "--fanout", str(cfg["fanout"]), *(["--dirichlet", "0.1"] if cfg["data"] == "dirichlet 0.1" else [])])


def virtual_run(tmp: Path, topology: Path, peers: int, seed: int, flags: list[str]) -> dict | None:
    """One `p2plearn-sim train` run of this experiment's model and schedule (HIDDEN, PERIOD, STEPS,
    EVAL_EVERY, EVAL_PEERS, MESSAGE_BYTES) with `flags`; its figures, or None if it failed."""
    out = tmp / "run.json"
    samples = max(12000, math.ceil(peers * 32 * 4 / 0.8))  # >= 4 batches of 32 per peer per epoch
    # --compress none: the scale claims compare float32 messages unless `flags` say otherwise
    argv = ["train", "--topology", str(topology), "--compress", "none", "--period", str(PERIOD), "--model", "mlp",
            "--hidden", str(HIDDEN), "--steps", str(STEPS), "--samples", str(samples), "--eval-every", str(EVAL_EVERY),
            "--eval-peers", str(EVAL_PEERS), "--message-bytes", str(MESSAGE_BYTES), "--seed", str(seed),
            "--json", str(out), *flags]
    if sim_main(argv) != 0:
        return None
    r = json.loads(out.read_text())
    return {"virtual_s": r["virtual_s"], "wall_s": r["wall_s"], "average_p": r["average_p"],
            "round_s": r["virtual_s"] / max(1, r["rounds"]), "delivered": r["delivered"],
            "final_accuracy": r["averaged_accuracy"], "history": [(t, mean) for t, _, mean in r["history"]],
            "own_accuracy_end": r["history"][-1][2] if r["history"] else math.nan,
            "message_bytes": r["message_bytes"], "mb_per_message": r.get("bytes_per_message", r["message_bytes"]) / 1e6,
            "bytes_ratio": r.get("bytes_ratio", 1.0), "parameters": r["parameters"], **c.compute_clock(r)}


def time_to_target(group: list[c.Row]) -> float:
    """Fix the group's target from seed 0's curves (selmcast_vs_random's rule) and give every run
    its `target` and `tta_s`; the target."""
    target = svr.target_of(group)
    for r in group:
        if r["ok"]:
            r["target"] = target
            r["tta_s"] = c.time_to_accuracy(r["history"], target)
    return target


def draw_curves(ax, shown: list[c.Row], label, title: str) -> None:
    """The runs' mean accuracy over virtual time, one curve per run, labelled label(run)."""
    for r in shown:
        t, a = zip(*r["history"])
        ax.plot(t, a, label=label(r))
    ax.set_xlabel("virtual seconds")
    ax.set_ylabel("mean test accuracy")
    ax.set_title(title)
    ax.legend()


def extra_flags(ap) -> None:
    ap.add_argument("--peers", default="16,64,256", help="comma-separated sizes (default: %(default)s)")
    ap.add_argument("--bursts", choices=("both", "yes", "no"), default="both", help="default: %(default)s")
    ap.add_argument("--data", choices=("both", "iid", "dirichlet"), default="both", help="default: %(default)s")
    ap.add_argument("--sync", choices=("both", "bsp", "ssp"), default="both", help="default: %(default)s")
    ap.add_argument("--name", default=NAME, type=c.results_name,
                    help="results file name, to run sizes in parallel processes "
                         "(default: %(default)s)")


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv, extra=extra_flags, report=True)
    os.chdir(c.ROOT)
    rows = c.read_rows(args.out / f"{args.name}.csv") if args.report else run_all(args)
    keys = ["peers", "bursts", "data", "sync", "selection", "fanout"]
    tables, verdicts = [], []
    for group in c.groups(rows, ["peers", "bursts", "data", "sync"]).values():
        target = time_to_target(group)
        tta = c.metric("tta_s")
        medians = {(r["selection"], r["fanout"]): c.summary(tta(x) for x in group if
                                                            (x["selection"], x["fanout"]) == (r["selection"], r["fanout"]))[0]
                   for r in group}
        random_p = {k: v for k, v in medians.items() if k[0] == "random" and math.isfinite(v)}
        best = min(random_p, key=random_p.get) if random_p else None
        head = group[0]
        where = f"{head['peers']} peers, {'bursts' if head['bursts'] else 'steady'}, {head['data']}, {head['sync']}"
        ratio = medians[("selmcast", 1)] / random_p[best] if best else math.nan
        verdicts.append(f"- {where}: target {target:.0%}; SELMCAST / best random-p (p={best[1] if best else '-'}) "
                        f"time to target = **{c.number(ratio, '.2f')}**")
        tables.append(f"**{where}** (target {target:.0%})\n\n" + c.table(
            group, keys, {"time to target s": tta, "final accuracy": c.metric("final_accuracy"),
                          "average p": c.metric("average_p"), "round s": c.metric("round_s"),
                          "delivered": c.metric("delivered"), "wall s (simulation)": c.metric("wall_s")}))
    setup = (f"Virtual time (`p2plearn-sim train`), MNIST-1D MLP hidden {HIDDEN} ({rows[0].get('parameters', '?')} "
             f"parameters) whose message occupies {MESSAGE_BYTES / 1e6:g} MB on the simulated network "
             f"(--message-bytes), a round every {PERIOD} steps, {STEPS} local steps, batch 32, SGD lr 0.1 momentum 0.9, "
             f"{c.seed_count(rows)} seed(s); heterogeneous tiers 25/50/100 Mbit/s (uplinks 1 or 0.5 of the downlink), "
             f"bursts: a quarter of the peers' downlinks at 0.1x for 2 s every 10 s. Cells: median [min-max] over "
             f"seeds. Accuracy: the mean over ranks 0..{EVAL_PEERS - 1}'s own models; final: the average model's. "
             + c.load_note(rows))

    def draw(ax) -> None:
        first = [r for r in rows if r["ok"] and r["seed"] == 0]
        shown = [r for r in first if (r["peers"], r["bursts"], r["data"], r["sync"]) ==
                 (first[0]["peers"], first[0]["bursts"], first[0]["data"], first[0]["sync"])]
        draw_curves(ax, shown, lambda r: f"{r['selection']} p={r['fanout']}",
                    f"{first[0]['peers']} peers, {first[0]['data']}, {first[0]['sync']}, seed 0")

    c.write_results(args.out, args.name, rows, "SELMCAST vs random-p, all and the exponential graph at scale, in virtual time",
                    setup, "\n\n".join(tables), draw, notes="\n".join(verdicts), report=args.report)


def run_all(args) -> list[c.Row]:
    """Every configuration the flags select, each over the seeds."""
    sizes, bursts = sizes_and_bursts(args)
    settings = [(b, d) for b in bursts for d in (["iid"] if args.quick else ["iid", "dirichlet 0.1"])
                if args.quick or args.data in ("both", d.split()[0])]
    syncs = SYNCS[:1] if args.quick else [(s, st) for s, st in SYNCS if args.sync in ("both", s)]
    return c.repeat_all(({"peers": n, "bursts": b, "data": data, "sync": sync, "staleness": staleness,
                          "selection": selection, "fanout": fanout}
                         for n in sizes for b, data in settings for sync, staleness in syncs
                         for selection, fanout in selections(n)), args.seeds, run)


def sizes_and_bursts(args) -> tuple[list[int], list[bool]]:
    """The sizes (--peers) and burst settings (--bursts) to run; --quick: 16 peers, steady."""
    if args.quick:
        return [16], [False]
    return [int(x) for x in args.peers.split(",")], [b for b in (False, True) if args.bursts in ("both", "yes" if b else "no")]


if __name__ == "__main__":
    sys.exit(main())
