"""Claim: where the senders' uplinks bound a round, IP multicast rounds take a fraction of unicast's
time; where the downlinks do, multicast gains little.

    sudo python experiments/bench_rounds_transport.py [--quick] [--seeds N] [--out DIR]

`python -m p2plearn.bench rounds --transport`'s configurations (`p2plearn.bench.rounds.run_config`) on
the root testbed (namespaces shaped to the topology, IP multicast across its bridge): 8 peers, 1 MB
messages, ring selection (each peer sends to the next p, so every uplink and every downlink carries
the same load), BSP, 12 rounds, no computation; a round's time is its slowest peer's communication
time, the median of rounds 2-11. Per topology and p, each transport mode in turn, unicast first, and
the ratio to that repetition's unicast: homogeneous-8, asymmetric-8 and heterogeneous-8 at p = 3
and 7 (unicast, multicast), mixed-8 (two peers behind routers, no IP multicast in or out) at p = 7
(unicast, multicast, auto). `--seeds N` repetitions of the whole set (default 3; nothing is drawn at
random: repetitions measure the testbed's noise), ~37 min. Quick: heterogeneous-8 at p = 7, once.
Root only.
"""
from __future__ import annotations

import subprocess
import sys

import common as c

from p2plearn.bench.rounds import run_config

NAME = "bench_rounds_transport"
MEGABYTES, ROUNDS = 1.0, 12
FULL = [(t, p, ("unicast", "multicast")) for t in ("homogeneous-8", "asymmetric-8", "heterogeneous-8")
        for p in (3, 7)] + [("mixed-8", 7, ("unicast", "multicast", "auto"))]
QUICK = [("heterogeneous-8", 7, ("unicast", "multicast"))]
KEYS = ["topology", "p", "transport"]


def measure(topology: str, p: int, mode: str) -> c.Row | None:
    try:
        return run_config(f"topology/{topology}.json", "ring", p, MEGABYTES, ROUNDS, mode)
    except (RuntimeError, subprocess.TimeoutExpired) as e:  # the job failed: its row says so
        print(f"  {e}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv)
    if not c.is_root():
        print(f"{NAME}: needs root (the testbed); skipped", file=sys.stderr)
        return
    rows = []
    for rep in range(args.seeds):
        for topology, p, modes in QUICK if args.quick else FULL:
            ours = []
            for mode in modes:
                ours += c.repeat({"topology": topology, "p": p, "transport": mode}, 1,
                                 lambda _, t=topology, p=p, m=mode: measure(t, p, m), first_seed=rep)
            unicast = ours[0].get("round_s") if ours[0]["ok"] else None
            for r in ours:
                r["x_unicast"] = r["round_s"] / unicast if r["ok"] and unicast else None
            rows += ours
    metrics = {"round s (median of rounds)": c.metric("round_s"), "x unicast (same repetition)": c.metric("x_unicast"),
               "planned T s": c.metric("planned_s"), "measured / planned": c.metric("measured_over_planned"),
               "uplink MB per peer per round": c.metric("uplink_mb"), "delivered": c.metric("delivered")}
    setup = (f"Root testbed, 8 peers, {MEGABYTES:g} MB messages, ring selection, BSP, {ROUNDS} rounds, no computation; "
             f"a round's time is the slowest peer's communication time (median of rounds 2-{ROUNDS - 1}); "
             f"{args.seeds} repetition(s) of every configuration, each transport right after that topology and p's "
             f"unicast, whose round the ratio divides by; median [min-max] over repetitions. {c.load_note(rows)}")

    def draw(ax) -> None:
        c.bar_chart(ax, rows, KEYS, c.metric("x_unicast"), "round time / unicast's (same repetition)",
                    "IP multicast and mixed mode against unicast, 8 peers, 1 MB")
        ax.axhline(1.0, color="grey", lw=0.8)

    c.write_results(args.out, NAME, rows, "Rounds: IP multicast vs unicast (and mixed mode) on the testbed", setup,
                    c.table(rows, KEYS, metrics), draw)


if __name__ == "__main__":
    main()
