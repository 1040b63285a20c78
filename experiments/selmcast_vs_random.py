"""Claim: SELMCAST picks receivers so that rounds are shorter than random-p at a similar or higher
average p, and reaches a target accuracy sooner, under BSP and SSP on a heterogeneous network.

    python experiments/selmcast_vs_random.py [--quick] [--seeds N] [--out DIR]

Full: heterogeneous-8 (emulated: each engine paced to its topology uplink), BSP and SSP (s = 1, 2, 4)
x selmcast, random p = 1, 2, 3 and all, 6 epochs, 3 seeds: about 20 configurations x 3 x ~35 s
(~90 min on 2 cores). Quick: heterogeneous-4, BSP x selmcast / random p=2 / all and SSP s=2 x
selmcast, 1 seed, 2 epochs (~2 min).
"""
from __future__ import annotations

import sys

import common as c

NAME = "selmcast_vs_random"


def configs(quick: bool) -> list[dict]:
    if quick:  # BSP against both baselines, SSP only to show it runs
        pairs = [("bsp", 0, "selmcast", 2), ("bsp", 0, "random", 2), ("bsp", 0, "all", 1), ("ssp", 2, "selmcast", 2)]
    else:
        pairs = [(s, st, sel, p) for s, st in [("bsp", 0), ("ssp", 1), ("ssp", 2), ("ssp", 4)]
                 for sel, p in [("selmcast", 2), ("random", 1), ("random", 2), ("random", 3), ("all", 1)]]
    return [{"sync": s, "staleness": st, "selection": sel, "fanout": p} for s, st, sel, p in pairs]


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv)
    n, topo = (4, "topology/heterogeneous-4.json") if args.quick else (8, "topology/heterogeneous-8.json")
    script = {"epochs": 2, "samples": 4000, "width": 64} if args.quick else {"epochs": 6, "samples": 12000, "width": 64}
    target = 0.3 if args.quick else 0.6
    rows = []
    for cfg in configs(args.quick):
        rows += c.repeat(cfg, args.seeds, lambda seed, cfg=cfg: c.train(n, cfg, {**script, "seed": seed},
                                                                        topology=topo))
    for r in rows:
        if r["ok"]:
            r["round_s"] = r["wall_s"] / max(1, r["rounds"])
            r["comm_p99_s"] = c.percentile(r["round_times"], 0.99)
            r["tta_s"] = c.time_to_accuracy(r["history"], target)
    keys = ["sync", "staleness", "selection", "fanout"]
    metrics = {"step time s (wall/rounds)": c.metric("round_s"), "comm p99 s (rank 0)": c.metric("comm_p99_s"),
               "average p": c.metric("average_p"), f"time to {target:.0%} s": c.metric("tta_s"),
               "final accuracy": c.metric("averaged_accuracy")}
    tables = "\n\n".join(
        f"### {sync.upper()}{f' s={st}' if sync == 'ssp' else ''}\n\n" +
        c.table([r for r in rows if (r["sync"], r["staleness"]) == (sync, st)], keys, metrics,
                baseline=(sync, st, "random", 2), ratio_of="step time s (wall/rounds)")
        for sync, st in dict.fromkeys((r["sync"], r["staleness"]) for r in rows))
    setup = (f"Emulated (`--emulate`: each engine paced to its node's uplink in `{topo}`; no namespaces), "
             f"{n} peers, MNIST-1D CNN width {script['width']}, {script['epochs']} epochs, {script['samples']} samples, "
             f"{args.seeds} seed(s) per configuration; cells are median [min-max] over seeds. Step time = training "
             f"wall time / rounds (compute + communication); the ratio column is step time / random p=2's in the "
             f"same sync mode. Time to accuracy: first epoch-end evaluation of rank 0's own model at >= {target:.0%}.")
    c.write_results(args.out, NAME, rows, "SELMCAST vs random-p vs all", setup, tables,
                    lambda ax: c.bar_chart(ax, rows, ["sync", "staleness", "selection", "fanout"], c.metric("round_s"),
                                           "step time (s per round)", f"{topo}: median step time, min-max over seeds"))


if __name__ == "__main__":
    sys.exit(main())
