"""Claim: p2plearn reaches a target accuracy sooner in wall time than what a torch user already has:
torch's local SGD with the same period (PeriodicModelAverager over gloo), DDP (gloo all_reduce every
step), and one process alone, on the same networks, model and data.

    sudo python experiments/time_to_accuracy.py [--quick] [--seeds N] [--out DIR]

As root every distributed system runs on the testbed (4 namespaces shaped by tbf; gloo with
GLOO_SOCKET_IFNAME and MASTER_ADDR = rank 0's testbed address); the single process needs no
network and runs outside it. Not root: p2plearn `--emulate` against gloo on unshaped loopback
(favours gloo), said in the table. Topologies: homogeneous-4 (100 Mbit/s), heterogeneous-4 (uplinks
12.5-250 Mbit/s) and lossy-4 (100 Mbit/s, 1% of packets lost, TCP and UDP alike).
Same model (MNIST-1D MLP, 2 hidden layers of 1536, 2.4M parameters, 9.7 MB), same samples and shards
per rank, same optimizer (SGD lr 0.1 momentum 0.9, batch 128 per rank), the same period for p2plearn
and local SGD; test accuracy every EVAL_EVERY steps of rank 0 (the single process: every
EVAL_EVERY x 4 steps, the same samples seen). DDP stops at a time budget (a run of it on
heterogeneous-4 would take ~20 min). Full: 10 epochs, 12000 samples, 3 seeds (~75 min).
Quick: 2 epochs (2 rounds), 1 seed, homogeneous-4 only.
"""
from __future__ import annotations

import sys

import common as c

NAME = "time_to_accuracy"
HIDDEN = 1536  # MLP: 2.4M parameters, 9.7 MB: at 100 Mbit/s an exchange costs ~50 local steps' compute
BATCH = 128
PERIOD = 16
EVAL_EVERY = 8
PEERS = 4
TOPOLOGIES = ["homogeneous-4", "heterogeneous-4", "lossy-4"]
# From a one-seed exploration on homogeneous-4 and heterogeneous-4 (selmcast p=1 and all, with and
# without overlap, and partitioned): selmcast p=1 was the soonest; a multicast full average (all) the
# latest; overlap shortened the wall time but not the time to accuracy (rank 0's model is merged a
# round late); partitioned is the full average at an all-reduce's cost. Those three are measured here.
P2PLEARN = {"sync": "bsp", "selection": "selmcast", "fanout": 1, "period": PERIOD}
# --compress fp16 halves the bytes of either (error feedback keeps the rounding from adding up).
P2PLEARN_CONFIGS = {f"bsp, selmcast p=1, period {PERIOD}": P2PLEARN,
                    f"bsp, selmcast p=1, period {PERIOD}, overlap": {**P2PLEARN, "overlap": True},
                    f"bsp, selmcast p=1, period {PERIOD}, compress fp16": {**P2PLEARN, "compress": "fp16"},
                    f"partitioned (full average), period {PERIOD}": {"sync": "partitioned", "period": PERIOD},
                    f"partitioned (full average), period {PERIOD}, compress fp16": {"sync": "partitioned",
                                                                                   "period": PERIOD,
                                                                                   "compress": "fp16"}}
DDP_BUDGET_S = 60.0


def mlp_size() -> int:
    from p2plearn.examples.mnist1d import MLP

    return sum(p.numel() for p in MLP(HIDDEN).parameters())


def torch_baseline(n: int, script: dict, testbed: bool, port: int, topology: str) -> c.Row | None:
    """experiments/torch_mnist1d.py on n ranks (in the testbed's namespaces when asked)."""
    return c.torch_job(c.ROOT / "experiments" / "torch_mnist1d.py", n, script, testbed=testbed, port=port,
                       topology=topology)


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv)
    testbed = c.is_root()
    script = {"model": "mlp", "hidden": HIDDEN, "batch_size": BATCH, "epochs": 2 if args.quick else 10,
              "samples": 12000, "eval_every": EVAL_EVERY}
    targets = (0.3, 0.4) if args.quick else (0.5, 0.6)
    budget = 10.0 if args.quick else 30.0  # accuracy reached by this many seconds of training
    topologies = TOPOLOGIES[:1] if args.quick else TOPOLOGIES
    rows: list[c.Row] = []
    for topo in topologies:
        where = {"topology": topo}
        for label, options in P2PLEARN_CONFIGS.items():
            rows += c.repeat({**where, "system": "p2plearn", "settings": label}, args.seeds,
                             lambda seed: c.train(PEERS, options, {**script, "seed": seed},
                                                  topology=f"topology/{topo}.json", testbed=testbed))
        rows += c.repeat({**where, "system": "local SGD", "settings": f"PeriodicModelAverager, period {PERIOD}"},
                         args.seeds, lambda seed: torch_baseline(PEERS, {**script, "seed": seed, "mode": "local-sgd",
                                                                          "period": PERIOD}, testbed, 29500 + seed, topo))
        rows += c.repeat({**where, "system": "DDP", "settings": "all_reduce every step"}, args.seeds,
                         lambda seed: torch_baseline(PEERS, {**script, "seed": seed, "mode": "ddp",
                                                             "budget_s": budget * 2 if args.quick else DDP_BUDGET_S},
                                                     testbed, 29600 + seed, topo))
    rows += c.repeat({"topology": "none", "system": "single process", "settings": "all the data, one process"},
                     args.seeds, lambda seed: torch_baseline(1, {**script, "seed": seed, "mode": "single",
                                                                 "eval_every": EVAL_EVERY * PEERS}, False, 0, ""))
    for r in rows:
        if r["ok"]:
            for target in targets:
                r[f"tta_{target}"] = c.time_to_accuracy(r["history"], target)
            r["accuracy_at_budget"] = max((acc for t, acc in r["history"] if t <= budget), default=float("nan"))
            r["mb_sent"] = r["bytes_sent"] / 1e6
    where = ("Testbed (root; 4 network namespaces shaped by tbf, loss by iptables; every distributed system)"
             if testbed else "Fallback (not root): p2plearn `--emulate` vs gloo on unshaped loopback")
    setup = (f"{where}. MNIST-1D MLP (2 hidden layers of {HIDDEN}, {mlp_size() / 1e6:.1f}M parameters), "
             f"{script['epochs']} epochs of {script['samples']} samples, batch {BATCH} per rank, SGD lr 0.1 "
             f"momentum 0.9, {PEERS} ranks, {args.seeds} seed(s), median [min-max]. Test accuracy of rank 0's own "
             f"model every {EVAL_EVERY} of its steps (time includes these evaluations, for every system); "
             f"final: the average of the ranks' models. p2plearn and local SGD exchange every {PERIOD} steps; "
             f"DDP stops after {DDP_BUDGET_S:g} s (quick: {budget * 2:g} s). MB sent: per rank (gloo: what a ring "
             f"all_reduce puts on each uplink, 2(n-1)/n of the model). Ratio: time to {targets[0]:.0%} / local "
             f"SGD's on the same topology.")
    keys = ["topology", "system", "settings"]
    metrics = {**{f"time to {t:.0%} s": c.metric(f"tta_{t}") for t in targets},
               f"accuracy at {budget:g} s": c.metric("accuracy_at_budget"),
               "final accuracy": c.metric("averaged_accuracy"), "wall s": c.metric("wall_s"),
               "MB sent": c.metric("mb_sent")}
    tables = []
    for topo in topologies:
        tables.append(f"**{topo}**\n\n" + c.table([r for r in rows if r["topology"] in (topo, "none")], keys, metrics,
                                                  baseline=(topo, "local SGD", f"PeriodicModelAverager, period {PERIOD}"),
                                                  ratio_of=f"time to {targets[0]:.0%} s"))
    c.write_results(args.out, NAME, rows, "Time to accuracy: p2plearn vs torch local SGD, DDP and one process",
                    setup, "\n\n".join(tables),
                    lambda ax: c.accuracy_curves(ax, [r for r in rows if r["topology"] in (topologies[0], "none")],
                                                 ["system", "settings"],
                                                 f"Test accuracy over wall time, {topologies[0]}, seed 0"))


if __name__ == "__main__":
    sys.exit(main())
