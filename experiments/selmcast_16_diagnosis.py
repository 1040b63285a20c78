"""Why SELMCAST is or is not sooner to the target on heterogeneous-16 (selmcast_vs_random.py's 16-peer part).

    python experiments/selmcast_16_diagnosis.py [--csv experiments/results/selmcast_vs_random_16.csv]

Measured (from the CSV, medians over seeds): time to target = rounds to target x wall per round.
Rounds to target says how well a selection mixes (fewer: the models agreed sooner); wall per round
what a round costs, split into rank 0's seconds waiting on communication and computing.
Planned (the selection policies alone, on heterogeneous-16's rates and the measured message size):
T of the plan on the base rates; T while the bursty peers' downlinks are at their burst rate, for
a plan made from the base rates (a view that has not followed the burst yet) and from the burst
rates (one that has); average p, the share of (peer, round) pairs that receive nothing, and
|lambda_2| of the mixing matrix averaged over 20 rounds (as `python -m p2plearn.bench selection`).
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

import numpy as np

import common as c
import selmcast_vs_random as exp
from p2plearn.bench.selection import MIXING_ROUNDS
from p2plearn.examples.mnist1d import CNN
from p2plearn.selection import NetworkView, average_fanout, make_policy, plan_time
from p2plearn.selection.view import FRAMING
from p2plearn.sim.tracking import Burst, FlowNetwork, track, true_rates
from p2plearn.topology import load


def read(path: Path) -> list[c.Row]:
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["ok"] != "True":
                continue
            rows.append({**r, "ok": True, "seed": int(r["seed"]), "staleness": int(r["staleness"]),
                         "fanout": int(r["fanout"]), "history": json.loads(r["history"]),
                         "slow_close": float(r.get("slow_close") or 0.0),  # runs before the slow close have none
                         "max_fanout": str(exp.cap_of(r)),
                         **{k: float(r[k]) for k in ("wall_s", "rounds", "comm_s", "compute_s", "average_p")}})
    return rows


def measured(rows: list[c.Row]) -> str:
    """The table of rounds to target and the cost of a round."""
    target = exp.TARGET_16
    rounds_per_eval = exp.EVAL_EVERY_16 // exp.PERIOD_16
    lines = [f"Target {target:.0%} (the experiment's).", "",
             "| sync | selection | p | slow close | max fanout | rounds to target | wall s per round | "
             "rank 0 comm s per round | rank 0 compute s per round | average p |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key, rs in c.groups(rows, ["sync", "staleness", "selection", "fanout", "slow_close", "max_fanout"]).items():
        reached = [rounds_per_eval * (i + 1) for r in rs
                   for i in [next((i for i, (_, acc) in enumerate(r["history"]) if acc >= target), None)]
                   if i is not None]
        cells = [c.cell(reached) + (f" ({len(rs) - len(reached)} n/a)" if len(reached) < len(rs) else ""),
                 *(c.cell(r[k] / r["rounds"] for r in rs) for k in ("wall_s", "comm_s", "compute_s")),
                 c.cell(r["average_p"] for r in rs)]
        sync = f"{key[0]}{f' s={key[1]}' if key[0] == 'ssp' else ''}"
        lines.append(f"| {sync} | {key[2]} | {key[3]} | {key[4]:g} | {key[5]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def planned() -> str:
    """The planner's side: T, average p, starvation and mixing per policy on heterogeneous-16."""
    message = sum(p.numel() for p in CNN(exp.WIDTH_16).parameters()) * 4 * FRAMING  # wire bytes, as the view counts
    topo = load(c.ROOT / exp.TOPOLOGY_16)
    up = np.array([topo.uplink_mbit(p) for p in topo.peers]) * 1e6 / 8
    down = np.array([topo.downlink_mbit(p) for p in topo.peers]) * 1e6 / 8
    burst_down = down.copy()
    for i, peer in enumerate(topo.peers):
        for event in topo.events(peer):
            burst_down[i] = event.changes.get("downlink_mbit", down[i] * 8 / 1e6) * 1e6 / 8
    n = len(up)

    def view(d: np.ndarray) -> NetworkView:
        return NetworkView(up, d, np.full(n, message), np.ones(n, dtype=bool))

    base, burst = view(down), view(burst_down)
    lines = [f"Message {message / 1e3:.0f} KB on the wire (CNN width {exp.WIDTH_16}); "
             f"{int((burst_down < down).sum())} downlinks at their burst rate in the burst columns (all at once: "
             f"the worst case).", "",
             "| selection | p | T ms | T ms in a burst, plan from base rates | T ms in a burst, plan from burst rates "
             "| average p | starved | abs(lambda_2) |", "|---|---|---|---|---|---|---|---|"]
    for name, p in [("selmcast", 1), ("random", 1), ("random", 2), ("random", 3), ("all", 1), ("exponential", 1)]:
        policy = make_policy(name, seed=0)
        t, stale, fresh, fanout = [], [], [], []
        average = np.zeros((n, n))
        starved = 0
        for rnd in range(MIXING_ROUNDS):
            plan = policy.plan(base, p, rnd)
            t.append(plan_time(base, plan))
            stale.append(plan_time(burst, plan))
            fresh.append(plan_time(burst, policy.plan(burst, p, rnd)))
            fanout.append(average_fanout(plan))
            weights = np.eye(n)
            for i, rs in plan.items():
                weights[rs, i] = 1
            starved += int((weights.sum(axis=1) == 1).sum())
            average += weights / weights.sum(axis=1, keepdims=True)
        lambda2 = np.sort(np.abs(np.linalg.eigvals(average / MIXING_ROUNDS)))[::-1][1]
        lines.append(f"| {name} | {p} | {1e3 * statistics.median(t):.0f} | {1e3 * statistics.median(stale):.0f} | "
                     f"{1e3 * statistics.median(fresh):.0f} | {statistics.mean(fanout):.2f} | "
                     f"{starved / (MIXING_ROUNDS * n):.0%} | {lambda2:.3f} |")
    return "\n".join(lines)


def closed_loop(round_s: float, rounds: int = 70, lag: int = 2) -> str:
    """The bursts in rounds of `round_s` seconds (SELMCAST's measured round), SELMCAST planning from
    the estimator's view of `lag` rounds before (`p2plearn.sim.tracking.track`, flows at their max-min fair rates): T of
    each round's plan on the true rates, against random p's and the exponential graph's plans."""
    topo = load(c.ROOT / exp.TOPOLOGY_16)
    up = np.array([topo.uplink_mbit(p) for p in topo.peers]) * 1e6 / 8
    down = np.array([topo.downlink_mbit(p) for p in topo.peers]) * 1e6 / 8
    n, message = len(up), sum(p.numel() for p in CNN(exp.WIDTH_16).parameters()) * 4 * FRAMING
    bursts = [Burst(i, int(start // round_s), int(end // round_s) + 1, e.changes["downlink_mbit"] * 1e6 / 8 / down[i])
              for i, peer in enumerate(topo.peers) for e in topo.events(peer)
              for start, end in e.occurrences(rounds * round_s)]
    trace = track(FlowNetwork(up, down, bursts), up, down, bursts, rounds, message_bytes=message / FRAMING, p=1,
                  lag=lag)
    burst_rounds = {r for b in bursts for r in range(b.start, b.end)}
    lines = [f"Closed loop (simulated, {rounds} rounds of {round_s:.2f} s, the measured SELMCAST round; the view "
             f"of {lag} rounds before; {len(burst_rounds)} rounds touch a burst):", "",
             "| selection | p | T ms, median | T ms, mean | T ms, mean in burst rounds "
             "| rounds with T > 2x the base T |",
             "|---|---|---|---|---|---|"]
    for name, p in [("selmcast", 1), ("random", 1), ("random", 3), ("exponential", 1)]:
        policy = make_policy(name, seed=0)
        ts = []
        for rnd in range(rounds):
            k = rnd - 1 - lag
            est_up, est_down = (trace.est_up[k], trace.est_down[k]) if k >= 0 else (up, down)
            planned_view = NetworkView(est_up, est_down, np.full(n, message), np.ones(n, dtype=bool))
            true_up, true_down = true_rates(up, down, bursts, rnd)
            ts.append(plan_time(NetworkView(true_up, true_down, np.full(n, message), np.ones(n, dtype=bool)),
                                policy.plan(planned_view, p, rnd)))
        base = min(ts)
        lines.append(f"| {name} | {p} | {1e3 * statistics.median(ts):.0f} | {1e3 * statistics.mean(ts):.0f} | "
                     f"{1e3 * statistics.mean(ts[r] for r in burst_rounds if r < rounds):.0f} | "
                     f"{sum(t > 2 * base for t in ts)} of {rounds} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=c.RESULTS / f"{exp.NAME_16}.csv")
    args = ap.parse_args(argv)
    rows = read(args.csv)
    # the closed loop's round: SELMCAST's without the slow close, in BSP where the CSV has it
    selmcast = [r for r in rows if r["selection"] == "selmcast" and not r["slow_close"] and r["max_fanout"] == "64"]
    bsp = [r for r in selmcast if r["sync"] == "bsp"]
    round_s = statistics.median(r["wall_s"] / r["rounds"] for r in bsp or selmcast)
    print("Measured (median [min-max] over seeds):\n\n" + measured(rows) +
          "\n\nPlanned (20 rounds, medians):\n\n" + planned() + "\n\n" + closed_loop(round_s))


if __name__ == "__main__":
    sys.exit(main())
