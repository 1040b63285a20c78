"""Claim: phase-aware tolerance (loose in the middle of training, exact at the start, the end and in
critical regimes) reaches a target accuracy sooner than exact delivery under microbursts, with the
final accuracy of exact delivery, and better than one fixed bound throughout.

    sudo python experiments/phase_aware.py [--quick] [--seeds N] [--out DIR]

`--emulate` applies only a topology's base rates and loss, not its scheduled events, so the bursts
need the testbed: as root this runs the peers in network namespaces with the topology's bursts
applied by the testbed scheduler; otherwise it falls back to `--emulate` (no bursts) and says so.
Full: microburst-8 (100 Mbit/s; every 5 s each peer gets a 0.25 s burst of 20% loss and 10 Mbit/s
downlink), exact / fixed 0.05 / phase, 6 epochs, 3 seeds (~6 min). Quick: microburst(4), 1 seed,
2 epochs (~1.5 min).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import common as c
from p2plearn.topology import microburst, save

NAME = "phase_aware"
CONFIGS = [{"tolerance": "fixed", "loss_bound": 0.0}, {"tolerance": "fixed", "loss_bound": 0.05},
           {"tolerance": "phase", "loss_bound": 0.05}]


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv)
    n = 4 if args.quick else 8
    script = {"epochs": 2 if args.quick else 6, "samples": 4000 if args.quick else 12000,
              "model": "mlp", "hidden": c.MLP_HIDDEN}
    target = 0.3 if args.quick else 0.5  # the MLP ends near 0.6 after 6 epochs (the CNN passed 0.8)
    testbed = c.is_root()
    rows = []
    with tempfile.TemporaryDirectory(prefix="p2pexp-") as tmp:
        topo = Path(tmp) / f"microburst-{n}.json"
        save(microburst(n), topo)
        for cfg in CONFIGS:
            rows += c.repeat(cfg, args.seeds, lambda seed, cfg=cfg: c.train(n, cfg, {**script, "seed": seed},
                                                                            topology=topo, testbed=testbed))
    for r in rows:
        if r["ok"]:
            r["tta_s"] = c.time_to_accuracy(r["history"], target)
            r["round_s"] = r["wall_s"] / max(1, r["rounds"])
    where = ("Testbed (root; network namespaces, tbf shaping, the bursts applied by the testbed scheduler)"
             if testbed else "Emulated fallback (not root: `--emulate` applies base rates only, NO bursts)")
    setup = (f"{where}; `microburst({n})` (100 Mbit/s; every 5 s per peer a 0.25 s burst of 20% loss and "
             f"10 Mbit/s downlink), MNIST-1D MLP ({c.MLP_HIDDEN} hidden units), {script['epochs']} epochs, "
             f"{script['samples']} samples, BSP, selmcast p=2, {args.seeds} seed(s); median [min-max]. exact = fixed "
             f"0; phase uses 0.05 as its middle-phase bound. Time to accuracy: first epoch-end evaluation of rank "
             f"0's own model at >= {target:.0%}. Ratio: time to accuracy / exact.")
    keys = ["tolerance", "loss_bound"]
    metrics = {f"time to {target:.0%} s": c.metric("tta_s"), "final accuracy": c.metric("averaged_accuracy"),
               "step time s": c.metric("round_s"), "wall s": c.metric("wall_s")}
    tables = c.table(rows, keys, metrics, baseline=("fixed", 0.0), ratio_of=f"time to {target:.0%} s")
    c.write_results(args.out, NAME, rows, "Phase-aware vs fixed vs exact under microbursts", setup, tables,
                    lambda ax: c.accuracy_curves(ax, rows, keys, f"microburst-{n}, seed 0"))


if __name__ == "__main__":
    sys.exit(main())
