"""Claim: SELMCAST's rounds stay faster than random p's, with a larger average p, from 16 to 10,000 peers.

    python experiments/scale.py [--quick] [--out experiments/results]

Simulated (p2plearn.sim, BSP, paced flows, exact delivery, no compute) on heterogeneous(n): downlinks
cycling through 50/100/200/500 Mbit/s, uplinks 1, 1/2 or 1/4 of them (the shipped tiers); every peer
sends 1 MB to at least p = 3 receivers. Writes scale.csv, scale.md (table and selmcast/random ratios)
and scale.png. --quick: up to 1,000 peers, 5 rounds (about a minute); full: up to 10,000, 20 rounds.
"""
from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import provenance  # experiments/ is the script's directory: on sys.path
from p2plearn.sim import Simulator
from p2plearn.topology import heterogeneous

POLICIES = ("selmcast", "random")
P = 3
MESSAGE_BYTES = 1_000_000


def run(sizes: list[int], rounds: int) -> list[dict]:
    rows = []
    for n in sizes:
        for policy in POLICIES:
            t = time.perf_counter()
            summary = Simulator.from_topology(heterogeneous(n), MESSAGE_BYTES, policy=policy, p=P).run(rounds).summary()
            rows.append({"peers": n, "policy": policy, "rounds": rounds, "mean_round_s": summary["mean_round_s"],
                         "average_p": summary["average_p"], "wall_s": time.perf_counter() - t})
            print(f"{n:6d} {policy:9s} round {summary['mean_round_s']:.3f} s  p {summary['average_p']:.2f}", flush=True)
    return rows


def write(rows: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scale.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({k: f"{v:.4f}" if isinstance(v, float) else v for k, v in r.items()} for r in rows)
    by = {(r["peers"], r["policy"]): r for r in rows}
    sizes = sorted({r["peers"] for r in rows})
    lines = ["# Round time and average p at scale (simulated)", "", provenance.current("scale", rows).line(), "",
             f"Setup: `p2plearn.sim.Simulator`, BSP, paced flows, exact delivery, no compute; peers from "
             f"`heterogeneous(n)` (downlinks 50/100/200/500 Mbit/s, uplinks x1, x1/2 or x1/4); {MESSAGE_BYTES / 1e6:g} MB "
             f"per message, p = {P}; mean over {rows[0]['rounds']} rounds (`python experiments/scale.py`).", "",
             "| peers | selmcast round s | random round s | round time selmcast/random | selmcast avg p "
             "| random avg p | avg p selmcast/random |", "|---|---|---|---|---|---|---|"]
    for n in sizes:
        s, r = by[n, "selmcast"], by[n, "random"]
        lines.append(f"| {n} | {s['mean_round_s']:.3f} | {r['mean_round_s']:.3f} | {s['mean_round_s'] / r['mean_round_s']:.2f} "
                     f"| {s['average_p']:.2f} | {r['average_p']:.2f} | {s['average_p'] / r['average_p']:.2f} |")
    (out / "scale.md").write_text("\n".join(lines) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for policy in POLICIES:
        a.plot(sizes, [by[n, policy]["mean_round_s"] for n in sizes], "o-", label=policy)
        b.plot(sizes, [by[n, policy]["average_p"] for n in sizes], "o-", label=policy)
    a.set(xscale="log", xlabel="peers", ylabel="mean round time (s)", title=f"Round time, {MESSAGE_BYTES / 1e6:g} MB, p={P}")
    b.set(xscale="log", xlabel="peers", ylabel="average p (receivers per sender)", title="Average p")
    a.set_ylim(bottom=0)
    b.set_ylim(bottom=0)
    a.legend()
    b.legend()
    fig.tight_layout()
    fig.savefig(out / "scale.png", dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    sizes, rounds = ([16, 64, 256, 1000], 5) if args.quick else ([16, 64, 256, 1000, 4000, 10000], 20)
    write(run(sizes, rounds), args.out)


if __name__ == "__main__":
    main()
