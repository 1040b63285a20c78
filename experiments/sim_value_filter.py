"""Claim (the seeds' value-filter claim, at scale): the value-bounded filter cuts a message's bytes,
so rounds are shorter and a target accuracy is reached sooner, at a small cost in accuracy; int8
compression is the fixed-ratio alternative.

    python experiments/sim_value_filter.py [--quick] [--report] [--seeds N] [--peers 64,256] [--out DIR]

In virtual time (`p2plearn-sim train`), the setting of `sim_scale.py`: heterogeneous tiers (downlinks
25/50/100 Mbit/s, uplinks 1 or 0.5 of them), steady and with a quarter of the peers bursting
(downlink to 0.1x for 2 s every 10 s); i.i.d. shards; BSP, SELMCAST p=1; the MNIST-1D MLP (hidden
sim_scale.HIDDEN) whose dense message occupies sim_scale.MESSAGE_BYTES on the network
(`--message-bytes`; compressed and filtered messages keep their ratio of it). Three messages:
`--filter none` (dense float32), `--filter value` per_element at `--filter-init-scale` 30 and
`--filter-period` 100 (the defaults, the scale `value_filter.py` runs as its default and in its quick
setting), and `--compress int8`. Time to target: the first evaluation at which the mean test accuracy
of ranks 0..EVAL_PEERS-1 reaches the target, fixed from seed 0's curves (selmcast_vs_random's rule).
Quick: 16 peers, steady, one seed.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import common as c
import sim_scale as scale

NAME = "sim_value_filter"
MESSAGES = [("dense", []), ("value filter", ["--filter", "value", "--filter-granularity", "per_element",
                                              "--filter-init-scale", "30", "--filter-period", "100"]),
            ("int8", ["--compress", "int8"])]


def run(tmp: Path, cfg: dict, flags: list[str], seed: int) -> dict | None:
    return scale.virtual_run(tmp, scale.topology_file(tmp, cfg["peers"], cfg["bursts"]), cfg["peers"], seed,
                             ["--sync", "bsp", "--selection", "selmcast", "--fanout", "1", *flags])


def extra_flags(ap) -> None:
    ap.add_argument("--peers", default="64,256", help="comma-separated sizes (default: %(default)s)")
    ap.add_argument("--bursts", choices=("both", "yes", "no"), default="both", help="default: %(default)s")


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv, extra=extra_flags, report=True)
    os.chdir(c.ROOT)
    rows = c.read_rows(args.out / f"{NAME}.csv") if args.report else run_all(args)
    tables, verdicts = [], []
    tta = c.metric("tta_s")
    for group in c.groups(rows, ["peers", "bursts"]).values():
        target = scale.time_to_target(group)
        medians = {m: c.summary(tta(r) for r in group if r["message"] == m)[0] for m, _ in MESSAGES}
        own = {m: c.summary(r["own_accuracy_end"] for r in group if r["ok"] and r["message"] == m)[0]
               for m, _ in MESSAGES}
        head = group[0]
        where = f"{head['peers']} peers, {'bursts' if head['bursts'] else 'steady'}"
        verdicts.append(f"- {where}: target {target:.0%}; time to target / dense: value filter "
                        f"**{c.number(medians['value filter'] / medians['dense'], '.2f')}**, int8 "
                        f"**{c.number(medians['int8'] / medians['dense'], '.2f')}**; the own models' accuracy after "
                        f"{scale.STEPS} steps: dense {own['dense']:.3f}, value filter {own['value filter']:.3f}, "
                        f"int8 {own['int8']:.3f}")
        tables.append(f"**{where}** (target {target:.0%})\n\n" + c.table(
            group, ["peers", "bursts", "message"],
            {"time to target s": tta, "final accuracy": c.metric("final_accuracy"),
             "own models' accuracy at the end": c.metric("own_accuracy_end"),
             "MB per message": c.metric("mb_per_message"), "bytes / dense": c.metric("bytes_ratio"),
             "round s": c.metric("round_s"), "average p": c.metric("average_p"),
             "wall s (simulation)": c.metric("wall_s")},
            baseline=(head["peers"], head["bursts"], "dense"), ratio_of="time to target s"))
    setup = (f"Virtual time (`p2plearn-sim train`), MNIST-1D MLP hidden {scale.HIDDEN} "
             f"({rows[0].get('parameters', '?')} parameters) whose dense message occupies "
             f"{scale.MESSAGE_BYTES / 1e6:g} MB on the simulated network (--message-bytes; a filtered or int8 message "
             f"its encoded bytes times the same factor), BSP, SELMCAST p=1, a round every {scale.PERIOD} steps, "
             f"{scale.STEPS} local steps, batch 32, SGD lr 0.1 momentum 0.9, i.i.d., {c.seed_count(rows)} seed(s); "
             f"heterogeneous tiers 25/50/100 Mbit/s (uplinks 1 or 0.5 of the downlink), bursts: a quarter of the "
             f"peers' downlinks at 0.1x for 2 s every 10 s. Value filter: per_element, --filter-init-scale 30, "
             f"--filter-period 100 (training's defaults; value_filter.py's default scale). Cells: median [min-max] "
             f"over seeds. Accuracy: the mean over ranks 0..{scale.EVAL_PEERS - 1}'s own models (at each evaluation, and "
             f"at the end); final: the average model's. Virtual times do not depend on the host's load. " + c.load_note(rows))

    def draw(ax) -> None:
        first = [r for r in rows if r["ok"] and r["seed"] == 0]
        shown = [r for r in first if (r["peers"], r["bursts"]) == (first[-1]["peers"], first[-1]["bursts"])]
        scale.draw_curves(ax, shown, lambda r: f"{r['message']} ({r['mb_per_message']:.2g} MB per message)",
                          f"{shown[0]['peers']} peers, {'bursts' if shown[0]['bursts'] else 'steady'}, seed 0")

    c.write_results(args.out, NAME, rows, "The value filter and int8 at scale, in virtual time", setup,
                    "\n\n".join(tables), draw, notes="\n".join(verdicts), report=args.report)


def run_all(args) -> list[c.Row]:
    """Every configuration the flags select, each over the seeds."""
    sizes, bursts = scale.sizes_and_bursts(args)
    return c.repeat_all(({"peers": n, "bursts": burst, "message": message} for n in sizes for burst in bursts
                         for message in dict(MESSAGES)), args.seeds,
                        lambda tmp, cfg, seed: run(tmp, cfg, dict(MESSAGES)[cfg["message"]], seed))


if __name__ == "__main__":
    sys.exit(main())
