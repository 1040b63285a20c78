"""Benchmark: what `p2plearn-sim train` costs in wall time, against the issue's budget (256 peers x
2,000 steps of a ~100k-parameter MNIST-1D MLP at batch 32 in under 10 minutes; 1,000 peers in under 30).

    python experiments/sim_budget.py [--peers 256,1000] [--steps 2000] [--threads 1] [--out DIR]

Per size: one BSP run (SELMCAST p=1, a round every 16 steps, heterogeneous tiers 25/50/100 Mbit/s)
of MLP hidden 300 (105,610 parameters), its wall time, its seconds per local step of all peers,
and the replicas' step alone on each path of `sim.replicas.Replicas`: "linear" (the one the run
takes for this MLP; also with two threads, where the run uses one), "vmap" (any other model's) and
one after another. The load average says how much
of the shared machine the run had; a run with fewer --steps is a measurement of its steps, and the
table says what 2,000 of them would take at that rate (a linear extrapolation, marked as such).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

import common as c

from p2plearn.examples.mnist1d import MLP
from p2plearn.sim.__main__ import main as sim_main
from p2plearn.sim.replicas import Replicas
from p2plearn.topology import heterogeneous, save

NAME = "sim_budget"
HIDDEN = 300
GOAL_STEPS = 2000
BUDGET_S = {256: 600, 1000: 1800}


def replica_step_s(n: int, path: str, threads: int = 1, repeats: int = 3) -> float:
    torch.set_num_threads(threads)
    try:
        replicas = Replicas(MLP(HIDDEN), n, lr=0.1, path=path)
        x, y = torch.randn(n, 32, 40), torch.randint(0, 10, (n, 32))
        replicas.step(x, y)
        t0 = time.perf_counter()
        for _ in range(repeats):
            replicas.step(x, y)
        return (time.perf_counter() - t0) / repeats
    finally:
        torch.set_num_threads(1)


def main(argv: list[str] | None = None) -> None:
    def extra(ap) -> None:
        ap.add_argument("--peers", default="256,1000", help="comma-separated sizes (default: %(default)s)")
        ap.add_argument("--steps", type=int, default=GOAL_STEPS, help="local steps per peer (default: %(default)s)")
        ap.add_argument("--threads", type=int, default=1, help="the run's --threads (default: %(default)s)")

    args = c.parse_args(__doc__, argv, extra=extra)
    os.chdir(c.ROOT)
    rows = []
    with tempfile.TemporaryDirectory(prefix="p2psim-") as tmp:
        for n in [int(x) for x in args.peers.split(",")]:
            topology = Path(tmp) / f"heterogeneous-{n}.json"
            save(heterogeneous(n, tiers=(25.0, 50.0, 100.0), up_ratios=(1.0, 0.5)), topology)
            out = Path(tmp) / "run.json"
            samples = max(12000, n * 32 * 2 * 5 // 4)  # 2 batches per peer per epoch
            t0 = time.monotonic()
            assert sim_main(["train", "--topology", str(topology), "--sync", "bsp", "--compress", "none",
                             "--period", "16", "--model", "mlp",
                             "--hidden", str(HIDDEN), "--steps", str(args.steps), "--samples", str(samples),
                             "--eval-every", str(args.steps), "--threads", str(args.threads),
                             "--json", str(out)]) == 0
            total = time.monotonic() - t0
            result = json.loads(out.read_text())
            per_step = result["wall_s"] / args.steps
            rows.append({"peers": n, "steps": args.steps, "parameters": result["parameters"], "wall_s": total,
                         "run_s": result["wall_s"], "per_step_s": per_step,
                         "at_2000_s": per_step * GOAL_STEPS, "budget_s": BUDGET_S.get(n, float("nan")),
                         "linear_step_s": replica_step_s(n, "linear"),
                         "linear_2_threads_step_s": replica_step_s(n, "linear", threads=2),
                         "vmap_step_s": replica_step_s(n, "vmap"), "sequential_step_s": replica_step_s(n, "sequential"),
                         "virtual_s": result["virtual_s"], "load_1min": os.getloadavg()[0],
                         "finished_utc": time.strftime("%H:%M:%S", time.gmtime())})
    lines = ["| peers | steps run | wall s (whole command) | s per step (run) | 2,000 steps s | budget s | "
             "replicas' step, linear s | linear, 2 threads s | vmap s | one after another s | load (1 min) |",
             "|" + "---|" * 11]
    for r in rows:
        extrapolated = "" if r["steps"] == GOAL_STEPS else " (extrapolated)"
        lines.append(f"| {r['peers']} | {r['steps']} | {r['wall_s']:.0f} | {r['per_step_s']:.3f} | "
                     f"{r['at_2000_s']:.0f}{extrapolated} | {r['budget_s']:.0f} | {r['linear_step_s']:.3f} | "
                     f"{r['linear_2_threads_step_s']:.3f} | {r['vmap_step_s']:.3f} | {r['sequential_step_s']:.3f} | "
                     f"{r['load_1min']:.1f} |")
    setup = (f"`p2plearn-sim train`, MLP hidden {HIDDEN} ({rows[0]['parameters']} parameters), batch 32, BSP SELMCAST "
             f"p=1, period 16, heterogeneous tiers; the run on {args.threads} thread(s), its replicas on the linear "
             f"path; the replicas' steps alone on one thread unless said. " + c.load_note(rows))

    def draw(ax) -> None:
        ax.bar([str(r["peers"]) for r in rows], [r["at_2000_s"] for r in rows], label="2,000 steps")
        ax.plot([str(r["peers"]) for r in rows], [r["budget_s"] for r in rows], "r_", markersize=40, label="budget")
        ax.set_xlabel("peers")
        ax.set_ylabel("wall seconds")
        ax.legend()

    c.write_results(args.out, NAME, rows, "Cost of virtual training", setup, "\n".join(lines), draw)


if __name__ == "__main__":
    sys.exit(main())
