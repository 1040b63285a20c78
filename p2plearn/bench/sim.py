"""Simulator benchmark: seconds to simulate rounds of many peers on one core.

    python -m p2plearn.bench sim [--peers 1000,10000] [--rounds 100] [--policies random,selmcast] [--p 3]

Peers from `heterogeneous(n)` (the shipped tiers), BSP, 1 MB messages. Planning (the selection
policy, once per round) and simulating are timed apart; target: 10,000 peers x 100 rounds in under
a minute.
"""
from __future__ import annotations

import argparse
import time

from p2plearn.sim import Simulator
from p2plearn.topology import heterogeneous


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m p2plearn.bench sim", description=__doc__.splitlines()[0])
    parser.add_argument("--peers", default="1000,10000", help="comma-separated peer counts (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=100, help="rounds simulated per case (default: %(default)s)")
    parser.add_argument("--policies", default="random,selmcast",
                        help="comma-separated selection policies (default: %(default)s)")
    parser.add_argument("--p", type=int, default=3, help="receivers per sender asked for (default: %(default)s)")
    args = parser.parse_args(argv)
    print("| peers | rounds | policy | seconds | planning s | simulating s | mean round s (simulated) | average p |")
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.peers.split(",")):
        for policy in args.policies.split(","):
            sim = Simulator.from_topology(heterogeneous(n), 1e6, policy=policy, p=args.p)
            t0 = time.process_time()
            for r in range(args.rounds):
                sim.plan(r)   # the plans are cached: the run below only simulates
            t1 = time.process_time()
            summary = sim.run(args.rounds).summary()
            t2 = time.process_time()
            print(f"| {n} | {args.rounds} | {policy} | {t2 - t0:.1f} | {t1 - t0:.1f} | {t2 - t1:.1f} "
                  f"| {summary['mean_round_s']:.3f} | {summary['average_p']:.2f} |", flush=True)
