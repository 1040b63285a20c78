"""Unequal message sizes, paced by `plan_flows`, on the root testbed: completion against the plan's T.

    python -m p2plearn.sim.unequal [--out experiments/results] [--rounds 6]

`measure(topology, sizes, p, rounds)` plans SELMCAST rounds on the topology's rates with peer i
sending sizes[i] bytes (counted in wire bytes, as `NetworkView.from_global` counts them), and runs
each round twice on the testbed (one `p2plearn.sim.peer` per namespace, barrier between rounds):
paced as `plan_flows` paces (each downlink shared in proportion to message size) and paced with
each downlink split equally per sender (the rule before). A round's completion is its slowest
flow's time from the start of its send to its close, as the sender's engine measured it.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from p2plearn.selection import PACING_HEADROOM, NetworkView, Selmcast, plan_flows, plan_time
from p2plearn.selection.view import FRAMING
from p2plearn.sim.validate import run_round, testbed_peers
from p2plearn.topology import Topology
from p2plearn.topology.generators import heterogeneous, homogeneous

# 8 peers on links of 10-40 Mbit/s (what the 2-core host carries with room), sizes 8x apart.
P = 2
SIZES = [50_000, 50_000, 100_000, 100_000, 200_000, 200_000, 400_000, 400_000]
CASES = {"homogeneous 20 Mbit/s": homogeneous(8, 20),
         "heterogeneous 10-40 Mbit/s down, 1/4-1x up": heterogeneous(8, tiers=(10, 20, 40))}


@dataclass
class Round:
    """One round: its plan's T and the measured completion, paced proportionally and equally."""

    planned_s: float
    proportional_s: float
    equal_s: float


def equal_split(view: NetworkView, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The old pacing: each downlink split equally among its senders, whatever their sizes."""
    indegree = np.bincount(dst, minlength=view.n)
    outdegree = np.bincount(src, minlength=view.n)
    return PACING_HEADROOM * np.minimum(view.downlink[dst] / indegree[dst], view.uplink[src] / outdegree[src])


def measure(topology: Topology, sizes: list[int], p: int, rounds: int, seed: int = 0) -> list[Round]:
    """`rounds` SELMCAST rounds on the testbed (root), each paced both ways (see the module docstring)."""
    n = len(topology.peers)
    up = np.array([topology.uplink_bytes_per_s(x) for x in topology.peers])
    down = np.array([topology.downlink_bytes_per_s(x) for x in topology.peers])
    view = NetworkView(up, down, np.array(sizes, float) * FRAMING, np.ones(n, dtype=bool))
    policy = Selmcast(seed=seed)
    out = []
    with testbed_peers(topology, "selmcast", p, max(sizes), 2 * rounds, seed) as (_, peers):
        for r in range(rounds):
            plan = policy.plan(view, p, r)
            src, dst, proportional = plan_flows(view, plan)
            times = []
            for k, rate in enumerate((proportional, equal_split(view, src, dst))):
                commands = []
                for i in range(n):
                    mine = src == i
                    flows = ",".join(f"{j}:{x:.0f}" for j, x in zip(dst[mine], rate[mine])) or "-"
                    commands.append(f"send {2 * r + k} {sizes[i]} {int(np.count_nonzero(dst == i))} {flows}")
                times.append(max(f["elapsed_s"] for report in run_round(peers, commands) for f in report["flows"]))
            out.append(Round(plan_time(view, plan), *times))
    return out


def write(results: dict[str, list[Round]], out: Path) -> None:
    """unequal_pacing.csv, .md and .png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    rows = ["case,round,planned_s,proportional_s,equal_s"] + [
        f"{name},{k},{r.planned_s:.4f},{r.proportional_s:.4f},{r.equal_s:.4f}"
        for name, rounds in results.items() for k, r in enumerate(rounds)]
    (out / "unequal_pacing.csv").write_text("\n".join(rows) + "\n")
    lines = ["# Unequal message sizes: paced completion against the plan's T", "",
             f"8 peers on the testbed, message sizes {sorted(set(SIZES))} bytes (two peers each), SELMCAST p={P}, "
             "each round run once per pacing, barrier between rounds (`python -m p2plearn.sim.unequal`). "
             "Completion: the slowest flow's time from its send to its close (sender's engine). T counts "
             "messages in wire bytes (x1.069 framing).", "",
             "| topology | pacing | completion / T, median [min-max] over rounds |", "|---|---|---|"]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, rounds in results.items():
        for label, ratio in (("proportional to size (plan_flows)", [r.proportional_s / r.planned_s for r in rounds]),
                             ("equal split per sender (before)", [r.equal_s / r.planned_s for r in rounds])):
            lines.append(f"| {name} | {label} | {np.median(ratio):.3f} [{min(ratio):.3f}-{max(ratio):.3f}] |")
            ax.plot(ratio, "o-" if label.startswith("prop") else "s--", label=f"{name}: {label}")
    (out / "unequal_pacing.md").write_text("\n".join(lines) + "\n")
    ax.axhline(1.15, color="grey", lw=1, label="1.15 x T")
    ax.set(xlabel="round", ylabel="completion / planned T", ylim=(0, None), title="Unequal sizes on the testbed")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "unequal_pacing.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m p2plearn.sim.unequal", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("experiments/results"),
                        help="directory for the table (CSV, Markdown) and the plot (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds measured per case (default: %(default)s)")
    args = parser.parse_args(argv)
    results = {}
    for name, topology in CASES.items():
        results[name] = measure(topology, SIZES, P, args.rounds)
        for r in results[name]:
            print(f"{name}: T {r.planned_s:.3f} s, proportional {r.proportional_s / r.planned_s:.3f} x T, "
                  f"equal {r.equal_s / r.planned_s:.3f} x T", flush=True)
    write(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
