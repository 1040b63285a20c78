"""Claim (issue 19): where the network replicates multicast, SELMCAST with IP multicast reaches the
16-peer experiment's target accuracy sooner than with unicast.

    sudo python experiments/multicast_16.py [--quick] [--report] [--seeds N] [--out DIR] [--steady] [--slow-close S]

The 16-peer setting of selmcast_vs_random.py (heterogeneous-16 on the testbed, whose bridge forwards
IP multicast, with its bursts; Dirichlet 0.1 shards; a round every PERIOD_16 steps; 10 epochs), BSP,
SELMCAST p=1, `--transport-mode unicast` against `multicast`, in the same run, 3 seeds: 6 runs of
60-120 s (~12 min). The target is fixed by selmcast_vs_random's rule (the highest accuracy every
configuration's seed-0 curve reached, rounded down to 5 points) before comparing. Root only (the
testbed); quick: 1 epoch, 1 seed. --steady: the same on heterogeneous-16 without its bursts
(`topology/heterogeneous-16-steady.json`, written to multicast_16_steady.*), which tells what the bursts
cost each transport. --slow-close S: both transports with `--slow-close S` (a member whose downlink
collapses is closed and stops pacing its group; multicast_16_slow.*).
"""
from __future__ import annotations

import sys

import common as c
import selmcast_vs_random as svr

NAME = "multicast_16"
STEADY_TOPOLOGY = "topology/heterogeneous-16-steady.json"
KEYS = ["sync", "selection", "fanout", "transport_mode"]


def configs(slow_close: float = 0.0) -> list[dict]:
    return [{"sync": "bsp", "staleness": 0, "selection": "selmcast", "fanout": 1, "period": svr.PERIOD_16,
             "transport_mode": mode, "slow_close": slow_close} for mode in ("unicast", "multicast")]


def main(argv: list[str] | None = None) -> None:
    def extra(ap) -> None:
        ap.add_argument("--steady", action="store_true", help="heterogeneous-16 without its bursts (multicast_16_steady.*)")
        ap.add_argument("--slow-close", type=float, default=0.0, help="S: both transports with --slow-close S (*_slow.*)")

    args = c.parse_args(__doc__, argv, extra=extra, report=True)
    topology, name = (STEADY_TOPOLOGY, NAME + "_steady") if args.steady else (svr.TOPOLOGY_16, NAME)
    name += "_slow" if args.slow_close else ""
    script = svr.script_16(args.quick)
    if args.report:
        rows = c.read_rows(args.out / f"{name}.csv")
    elif not c.is_root():
        print("multicast_16: needs root (the testbed's bridge is what replicates multicast); skipped", file=sys.stderr)
        return
    else:
        rows = []
        for cfg in configs(args.slow_close):
            rows += c.repeat(cfg, args.seeds, lambda seed, cfg=cfg: c.train(16, cfg, {**script, "seed": seed},
                                                                            topology=topology, testbed=True))
    target = svr.target_of(rows)
    for r in rows:
        if r["ok"]:
            r["round_s"] = r["wall_s"] / max(1, r["rounds"])
            r["tta_s"] = c.time_to_accuracy(r["history"], target)
    tta = f"time to {target:.0%} s"
    metrics = {tta: c.metric("tta_s"), "final accuracy": c.metric("averaged_accuracy"),
               "average p": c.metric("average_p"), "round s (wall/rounds)": c.metric("round_s"),
               "comm s (rank 0)": c.metric("comm_s"), "wall s": c.metric("wall_s")}
    table = c.table(rows, KEYS, metrics, baseline=("bsp", "selmcast", 1, "unicast"), ratio_of=tta)
    median = {mode: c.summary(c.metric("tta_s")(r) for r in rows if r["transport_mode"] == mode)[0]
              for mode in ("unicast", "multicast")}
    verdict = (f"- SELMCAST, multicast / unicast time to {target:.0%}: {median['multicast']:.3g} / "
               f"{median['unicast']:.3g} s = **{median['multicast'] / median['unicast']:.2f}** (issue 33's goal: <= 0.8).")
    bursts = "no bursts" if args.steady else "its bursts applied"
    setup = (f"Testbed (root; 16 namespaces on one bridge, shaped from `{topology}`, {bursts}). "
             f"The 16-peer setting of selmcast_vs_random: Dirichlet alpha {svr.DIRICHLET} shards, MNIST-1D CNN width "
             f"{script['width']}, {script['epochs']} epoch(s), a round every {svr.PERIOD_16} steps, BSP, SELMCAST p=1"
             f"{f', --slow-close {args.slow_close:g}' if args.slow_close else ''}; unicast vs IP multicast "
             f"(`--transport-mode`), {args.seeds} seed(s); cells are median [min-max] over seeds. Target fixed by "
             f"selmcast_vs_random's rule from seed 0's curves. {c.load_note(rows)}")

    def draw(ax) -> None:  # seed 0's curves
        for (_, _, _, mode), rs in c.groups(rows, KEYS).items():
            hist = next((r["history"] for r in rs if r["ok"] and r["history"]), None)
            if hist:
                ax.plot([h[0] for h in hist], [h[1] for h in hist], marker=".", label=mode)
        ax.axhline(target, color="gray", linewidth=1)
        ax.set_xlabel("wall time since training start (s)")
        ax.set_ylabel("test accuracy (rank 0's own model)")
        ax.set_title(f"{topology} (testbed), SELMCAST p=1, seed 0; grey: the target", fontsize=9)
        ax.legend(fontsize=8)

    c.write_results(args.out, name, rows, "SELMCAST with IP multicast vs unicast: 16 peers", setup, table, draw,
                    notes=verdict, report=args.report)


if __name__ == "__main__":
    sys.exit(main())
