"""Claim: p2plearn reaches a target accuracy sooner in wall time than what a torch user already has:
torch's local SGD with the same period (PeriodicModelAverager over gloo), DDP (gloo all_reduce every
step), and one process alone, on the same networks, model and data.

    sudo python experiments/time_to_accuracy.py [--rows full|streaming|mixing|change] [--quick] [--seeds N] [--out DIR]

As root every distributed system runs on the testbed (4 namespaces shaped by tbf; gloo with
GLOO_SOCKET_IFNAME and MASTER_ADDR = rank 0's testbed address); the single process needs no
network and runs outside it. Not root: p2plearn `--emulate` against gloo on unshaped loopback
(favours gloo), said in the table. Topologies: homogeneous-4 (100 Mbit/s), heterogeneous-4 (uplinks
12.5-250 Mbit/s) and lossy-4 (100 Mbit/s, 1% of packets lost, TCP and UDP alike).
Same model (MNIST-1D MLP, 2 hidden layers of 1536, 2.4M parameters, 9.7 MB), same samples and shards
per rank, same optimizer (SGD lr 0.1 momentum 0.9, batch 128 per rank), the same period for p2plearn
and local SGD; test accuracy every EVAL_EVERY steps of rank 0 (the single process: every
EVAL_EVERY x 4 steps, the same samples seen). DDP stops at a time budget (a run of it on
heterogeneous-4 would take ~20 min). Full: 10 epochs, 12000 samples, 3 seeds (~90 min).
Quick: 2 epochs (2 rounds), 1 seed, homogeneous-4 only.

--rows streaming (time_to_accuracy_streaming.*): streaming rounds (--fragments, --overlap-steps,
--compress int4) beside local SGD on the three topologies, with each run's peak uplink rate (rank
0's engine, bytes sent per 1 s window) and wall / max(compute, communication) (~35 min).
--rows mixing (time_to_accuracy_mixing.*): the overlap's delay and mixing (tau, alpha) on
homogeneous-4 beside local SGD: what chose the streaming rows' settings (~10 min with 2 seeds).
--rows change (time_to_accuracy_change.*): partitioned rounds with --compress int4, which send the
change since the last round, whole and streamed, beside local SGD on homogeneous-4 and lossy-4 (where
partitioned rounds are the choice; ~12 min).
--rows fast (time_to_accuracy_fast.*): where the network is no limit (unshaped loopback, every system
alike): both round kinds with and without int4 beside local SGD, which says what the int4 default costs
on a fast link (~10 min).
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
# round late; the streaming rows measure it). Measured here: the defaults and partitioned rounds (the
# full average at an all-reduce's cost), each plain, --compress fp16 and --compress int4 (the change
# since the last round, in 4 bits), all beside the same baseline runs: what chose the defaults.
P2PLEARN = {"sync": "bsp", "selection": "selmcast", "fanout": 1, "period": PERIOD}
PARTITIONED = {"sync": "partitioned", "period": PERIOD}
P2PLEARN_CONFIGS = {f"{label}{compressed}": {**options, **({"compress": codec} if codec else {})}
                    for label, options in {f"bsp, selmcast p=1, period {PERIOD}": P2PLEARN,
                                           f"partitioned (full average), period {PERIOD}": PARTITIONED}.items()
                    for compressed, codec in {"": None, ", compress fp16": "fp16", ", compress int4": "int4"}.items()}
DDP_BUDGET_S = 60.0
# Streaming rounds: 4 fragments (a round every 4 steps, 2.4 MB each), landing TAU steps after they
# start, mixed as ALPHA says (None: the change added). Chosen by --rows mixing on homogeneous-4
# (2 seeds): tau 2 with alpha 0.5 reached 50% and 60% soonest (0.84x and 0.81x local SGD), 1.4 points lower.
FRAGMENTS, TAU, ALPHA = 4, 2, 0.5
STREAMING = {**P2PLEARN, "fragments": FRAGMENTS, "overlap_steps": TAU,
             **({"overlap_alpha": ALPHA} if ALPHA is not None else {})}
STREAMED = f"fragments {FRAGMENTS}, overlap-steps {TAU}" + (f", alpha {ALPHA}" if ALPHA is not None else "")
STREAMING_CONFIGS = {f"bsp, selmcast p=1, period {PERIOD} (whole rounds: the peak's reference)": P2PLEARN,
                     f"bsp, selmcast p=1, period {PERIOD}, {STREAMED}": STREAMING,
                     f"bsp, selmcast p=1, period {PERIOD}, {STREAMED}, compress int4": {**STREAMING, "compress": "int4"},
                     f"partitioned, period {PERIOD}, {STREAMED}, compress int4":
                         {**STREAMING, "sync": "partitioned", "compress": "int4"}}
MIXING_CONFIGS = {f"bsp, selmcast p=1, period {PERIOD}, fragments {FRAGMENTS}{label}": {
    **P2PLEARN, "fragments": FRAGMENTS, **options}
    for label, options in {"": {}, ", overlap (tau 4)": {"overlap": True},
                           ", tau 1": {"overlap_steps": 1}, ", tau 2": {"overlap_steps": 2},
                           ", tau 2, alpha 0.5": {"overlap_steps": 2, "overlap_alpha": 0.5},
                           ", tau 2, alpha 1": {"overlap_steps": 2, "overlap_alpha": 1.0}}.items()}
CHANGE_CONFIGS = {f"partitioned, period {PERIOD}, compress int4": {"sync": "partitioned", "period": PERIOD,
                                                                 "compress": "int4"},
                  f"partitioned, period {PERIOD}, {STREAMED}, compress int4":
                      {**STREAMING, "sync": "partitioned", "compress": "int4"}}
FAST_CONFIGS = {label: options for label, options in P2PLEARN_CONFIGS.items() if "fp16" not in label}
LOOPBACK = "loopback"  # no topology: every system on unshaped loopback
ROWS = {"full": (NAME, TOPOLOGIES, P2PLEARN_CONFIGS), "streaming": (f"{NAME}_streaming", TOPOLOGIES, STREAMING_CONFIGS),
        "mixing": (f"{NAME}_mixing", TOPOLOGIES[:1], MIXING_CONFIGS), "change": (f"{NAME}_change", [TOPOLOGIES[0], TOPOLOGIES[2]], CHANGE_CONFIGS),
        "fast": (f"{NAME}_fast", [LOOPBACK], FAST_CONFIGS)}


def mlp_size() -> int:
    from p2plearn.examples.mnist1d import MLP

    return sum(p.numel() for p in MLP(HIDDEN).parameters())


def torch_baseline(n: int, script: dict, testbed: bool, port: int, topology: str) -> c.Row | None:
    """experiments/torch_mnist1d.py on n ranks (in the testbed's namespaces when asked)."""
    return c.torch_job(c.ROOT / "experiments" / "torch_mnist1d.py", n, script, testbed=testbed, port=port,
                       topology=topology)


def main(argv: list[str] | None = None) -> None:
    def extra(ap) -> None:
        ap.add_argument("--rows", choices=list(ROWS), default="full",
                        help="full: every system; streaming: streaming rounds beside local SGD; mixing: the overlap's "
                             "tau and alpha on homogeneous-4 beside local SGD; change: partitioned int4 rounds; "
                             "fast: with and without int4 on unshaped loopback (default: %(default)s)")

    args = c.parse_args(__doc__, argv, extra=extra)
    name, topologies, configs = ROWS[args.rows]
    full = args.rows == "full"
    testbed = c.is_root()
    script = {"model": "mlp", "hidden": HIDDEN, "batch_size": BATCH, "epochs": 2 if args.quick else 10,
              "samples": 12000, "eval_every": EVAL_EVERY}
    targets = (0.3, 0.4) if args.quick else (0.5, 0.6)
    budget = 10.0 if args.quick else 30.0  # accuracy reached by this many seconds of training
    topologies = topologies[:1] if args.quick else topologies
    rows: list[c.Row] = []
    for topo in topologies:
        where = {"topology": topo}
        shaped = topo != LOOPBACK
        for label, options in configs.items():
            rows += c.repeat({**where, "system": "p2plearn", "settings": label}, args.seeds,
                             lambda seed: c.train(PEERS, options, {**script, "seed": seed},
                                                  topology=f"topology/{topo}.json" if shaped else None,
                                                  testbed=testbed))
        rows += c.repeat({**where, "system": "local SGD", "settings": f"PeriodicModelAverager, period {PERIOD}"},
                         args.seeds, lambda seed: torch_baseline(PEERS, {**script, "seed": seed, "mode": "local-sgd",
                                                                          "period": PERIOD}, testbed and shaped,
                                                                 29500 + seed, topo))
        if not full:
            continue
        rows += c.repeat({**where, "system": "DDP", "settings": "all_reduce every step"}, args.seeds,
                         lambda seed: torch_baseline(PEERS, {**script, "seed": seed, "mode": "ddp",
                                                             "budget_s": budget * 2 if args.quick else DDP_BUDGET_S},
                                                     testbed, 29600 + seed, topo))
    if full:
        rows += c.repeat({"topology": "none", "system": "single process", "settings": "all the data, one process"},
                         args.seeds, lambda seed: torch_baseline(1, {**script, "seed": seed, "mode": "single",
                                                                     "eval_every": EVAL_EVERY * PEERS}, False, 0, ""))
    for r in rows:
        if r["ok"]:
            for target in targets:
                r[f"tta_{target}"] = c.time_to_accuracy(r["history"], target)
            r["accuracy_at_budget"] = max((acc for t, acc in r["history"] if t <= budget), default=float("nan"))
            r["mb_sent"] = r["bytes_sent"] / 1e6
            c.add_streaming_metrics(r)
    where = ("Unshaped loopback, every system alike (no network limit: what each costs in CPU)" if LOOPBACK in topologies
             else "Testbed (root; 4 network namespaces shaped by tbf, loss by iptables; every distributed system)"
             if testbed else "Fallback (not root): p2plearn `--emulate` vs gloo on unshaped loopback")
    setup = (f"{where}. MNIST-1D MLP (2 hidden layers of {HIDDEN}, {mlp_size() / 1e6:.1f}M parameters), "
             f"{script['epochs']} epochs of {script['samples']} samples, batch {BATCH} per rank, SGD lr 0.1 "
             f"momentum 0.9, {PEERS} ranks, {args.seeds} seed(s), median [min-max]. Test accuracy of rank 0's own "
             f"model every {EVAL_EVERY} of its steps (time includes these evaluations, for every system); "
             f"final: the average of the ranks' models. p2plearn and local SGD exchange every {PERIOD} steps"
             + (f"; DDP stops after {DDP_BUDGET_S:g} s (quick: {budget * 2:g} s)" if full else "") +
             f". MB sent: per rank (gloo: what a ring "
             f"all_reduce puts on each uplink, 2(n-1)/n of the model). Ratio: time to {targets[0]:.0%} / local "
             f"SGD's on the same topology." + (f" Peak uplink: rank 0's engine, the most bytes it sent in any 1 s "
             f"window (sampled every 50 ms; data, repairs, ACKs and headers). Wall / bound: wall time over the "
             f"larger of rank 0's compute and its rounds' summed duration (1 = communication fully hidden)."
             if not full else "") + " " + c.load_note(rows))
    keys = ["topology", "system", "settings"]
    metrics = {**{f"time to {t:.0%} s": c.metric(f"tta_{t}") for t in targets},
               f"accuracy at {budget:g} s": c.metric("accuracy_at_budget"),
               "final accuracy": c.metric("averaged_accuracy"), "wall s": c.metric("wall_s"),
               "MB sent": c.metric("mb_sent"),
               **(c.STREAMING_METRICS if not full else {})}
    tables = []
    for topo in topologies:
        tables.append(f"**{topo}**\n\n" + c.table([r for r in rows if r["topology"] in (topo, "none")], keys, metrics,
                                                  baseline=(topo, "local SGD", f"PeriodicModelAverager, period {PERIOD}"),
                                                  ratio_of=f"time to {targets[0]:.0%} s"))
    title = {"full": "Time to accuracy: p2plearn vs torch local SGD, DDP and one process",
             "streaming": "Time to accuracy of streaming rounds (fragments, bounded overlap, 4-bit) vs torch local SGD",
             "mixing": "Streaming rounds: the overlap's delay (tau) and mixing (alpha) vs torch local SGD",
             "change": "Partitioned rounds sending the int4 change vs torch local SGD",
             "fast": "Time to accuracy where the network is no limit (loopback): with and without int4"}[args.rows]
    c.write_results(args.out, name, rows, title,
                    setup, "\n\n".join(tables),
                    lambda ax: c.accuracy_curves(ax, [r for r in rows if r["topology"] in (topologies[0], "none")],
                                                 ["system", "settings"],
                                                 f"Test accuracy over wall time, {topologies[0]}, seed 0"))


if __name__ == "__main__":
    sys.exit(main())
