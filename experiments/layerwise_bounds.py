"""Claim: per-layer loss bounds (`layerwise`: tighter on small/sensitive layers, looser on large ones)
keep accuracy at least as well as one `fixed` bound at the same overall delivered fraction.

    python experiments/layerwise_bounds.py [--quick] [--seeds N] [--out DIR]

Emulated (`--emulate`): a generated homogeneous topology with 10% random loss on what each peer
receives (saved to a temporary file), so that bounds decide how much is retransmitted.
Full: 4 peers, exact (fixed 0) and fixed / layerwise at overall bounds 0.05 and 0.1, 6 epochs,
3 seeds (~8 min). Quick: exact, fixed 0.05, layerwise 0.05, 1 seed, 2 epochs (~1.5 min).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import common as c
from p2plearn.topology import homogeneous, save

NAME = "layerwise_bounds"


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv)
    bounds = [0.05] if args.quick else [0.05, 0.1]
    configs = [{"tolerance": "fixed", "loss_bound": 0.0}] + [
        {"tolerance": t, "loss_bound": b} for b in bounds for t in ("fixed", "layerwise")]
    script = {"epochs": 2 if args.quick else 6, "samples": 4000 if args.quick else 12000,
              "model": "mlp", "hidden": c.MLP_HIDDEN}
    rows = []
    with tempfile.TemporaryDirectory(prefix="p2pexp-") as tmp:
        topo = Path(tmp) / "homogeneous-4-loss10.json"
        save(homogeneous(4, 100.0, loss=0.1), topo)
        for cfg in configs:
            rows += c.repeat(cfg, args.seeds, lambda seed, cfg=cfg: c.train(4, cfg, {**script, "seed": seed},
                                                                            topology=topo))
    for r in rows:
        if r["ok"]:
            r["round_s"] = r["wall_s"] / max(1, r["rounds"])
            r["comm_median_s"] = c.percentile(r["round_times"], 0.5)
    metrics = {"delivered": c.metric("delivered"), "step time s": c.metric("round_s"),
               "comm median s": c.metric("comm_median_s"), "final accuracy": c.metric("averaged_accuracy")}
    setup = (f"Emulated (`--emulate`, no namespaces): `homogeneous(4, 100 Mbit/s, loss=0.1)` written to a "
             f"temporary topology file; MNIST-1D MLP ({c.MLP_HIDDEN} hidden units), {script['epochs']} epochs, "
             f"{script['samples']} samples, BSP, selmcast p=2, {args.seeds} seed(s); median [min-max]. "
             f"`loss_bound` is fixed's bound and layerwise's overall target; `delivered` is rank 0's mean "
             f"delivered fraction of merged messages, to check both run at the same overall fraction. "
             f"Ratio: step time / exact (fixed 0).")
    tables = c.table(rows, ["tolerance", "loss_bound"], metrics, baseline=("fixed", 0.0), ratio_of="step time s")
    c.write_results(args.out, NAME, rows, "Layer-wise vs fixed loss bounds", setup, tables,
                    lambda ax: c.bar_chart(ax, rows, ["tolerance", "loss_bound"], c.metric("averaged_accuracy"),
                                           "final test accuracy (averaged model)",
                                           "10% random loss, emulated: median, min-max over seeds"))


if __name__ == "__main__":
    sys.exit(main())
