"""Claim: the value-bounded filter cuts bytes sent at little cost in accuracy; per-element (with
residuals) saves more than per-layer.

    python experiments/value_filter.py [--quick] [--seeds N] [--out DIR]

Emulated (`--emulate`) on homogeneous-4 (100 Mbit/s). Thresholds are `--filter-init-scale` (the first
round's threshold as a multiple of the first round's mean |update|, which momentum makes ~10x smaller
than later ones; it decays as 1/sqrt(t), t counted in `--filter-period` rounds, default 100).
Full: no filter, and per_element / per_layer at scales 10, 30 (the default), 100; 6 epochs, 3 seeds
(runs of 0.4-2.4 min, the whole set ~36 min on 2 cores). Quick:
no filter, per_element 30, per_layer 30; 1 seed, 2 epochs (~1.5 min).
"""
from __future__ import annotations

import sys

import common as c

NAME = "value_filter"


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv)
    scales = [30.0] if args.quick else [10.0, 30.0, 100.0]
    configs = [{"filter": "none", "filter_granularity": "-", "filter_init_scale": "-"}] + [
        {"filter": "value", "filter_granularity": g, "filter_init_scale": s}
        for g in ("per_element", "per_layer") for s in scales]
    script = {"epochs": 2 if args.quick else 6, "samples": 4000 if args.quick else 12000,
              "model": "mlp", "hidden": c.MLP_HIDDEN}

    def run(cfg: dict, seed: int) -> c.Row | None:
        options = {k: v for k, v in cfg.items() if v != "-"}
        return c.train(4, options, {**script, "seed": seed}, topology="topology/homogeneous-4.json")

    rows = []
    for cfg in configs:
        rows += c.repeat(cfg, args.seeds, lambda seed, cfg=cfg: run(cfg, seed))
    for r in rows:
        if r["ok"]:
            r["mb_sent"] = r["bytes_sent"] / 1e6
    keys = ["filter", "filter_granularity", "filter_init_scale"]
    metrics = {"MB sent (rank 0)": c.metric("mb_sent"), "final accuracy": c.metric("averaged_accuracy"),
               "wall s": c.metric("wall_s")}
    setup = (f"Emulated (`--emulate`, no namespaces), `topology/homogeneous-4.json`, MNIST-1D MLP "
             f"({c.MLP_HIDDEN} hidden units), {script['epochs']} epochs, {script['samples']} samples, BSP, selmcast p=2, "
             f"{args.seeds} seed(s); median [min-max]. Ratio: MB sent / no filter.")
    tables = c.table(rows, keys, metrics, baseline=("none", "-", "-"), ratio_of="MB sent (rank 0)")

    def draw(ax) -> None:
        for key, rs in c.groups(rows, keys).items():
            mb, acc = c.summary(c.metric("mb_sent")(r) for r in rs)[0], c.summary(
                c.metric("averaged_accuracy")(r) for r in rs)[0]
            ax.scatter([mb], [acc])
            ax.annotate(" ".join(str(k) for k in key if k != "-"), (mb, acc), fontsize=7)
        ax.set_xlabel("MB sent by rank 0 (median over seeds)")
        ax.set_ylabel("final test accuracy (averaged model)")
        ax.set_title("Value filter: bytes against accuracy", fontsize=10)

    c.write_results(args.out, NAME, rows, "Value-bounded filter: bytes and accuracy", setup, tables, draw)


if __name__ == "__main__":
    sys.exit(main())
