"""Round benchmark: measured round time of SELMCAST vs random receiver selection, in one run; or of
IP multicast vs unicast.

    python -m p2plearn.bench rounds [--json] [--topology topology/heterogeneous-8.json]
                                    [--megabytes 1] [--rounds 30] [--fanout 2]
    python -m p2plearn.bench rounds --transport [--fanouts 1,3,7] [--modes unicast,multicast]
                                    [--topology topology/homogeneous-8.json]

Each configuration launches one peer per topology slot with `p2plearn-run --emulate` (engines
pace to the topology's rates on loopback, no root needed). Every peer runs BSP rounds of a
model-sized message and no computation, and records each round's communication time and the
plan's T. The round time of the job is the slowest peer's, per round; the table reports the
median over rounds and the ratio to random's, and measured / planned.
Targets (issue 5): selmcast round time <= 0.6x random's; measured / planned <= 1.15.

--transport: for each p in --fanouts, ring selection (every peer sends to the next p and receives
from p: each uplink and each downlink carries the same load) with each --transport-mode of --modes
in turn (unicast first: the ratios are to it), on the root testbed (real links, shaped; IP multicast across its bridge). It reports the
round time, the message bytes each peer's engine put on its uplink per round (engine counters; the mean
and per rank), and the fraction delivered. Note that when every peer sends, each downlink takes p messages either way,
so multicast cannot make a round shorter than p M / D: it frees the uplinks, which is what rounds
bound by the senders' uplinks (few senders, or uplinks slower than downlinks) gain from.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def peer_main(out_dir: str, megabytes: float, rounds: int, model_name: str = "flat") -> None:
    """One peer: BSP rounds of a model (`model_name` of bench.models: one flat tensor of `megabytes`,
    or a real model's tensor shapes), no computation; writes each round's timings and this process's
    CPU seconds (every thread: the engine's too), and its peak RSS (run it with --period 1: a round
    per step)."""
    import resource
    import time

    import torch

    import p2plearn
    from p2plearn.bench import profile
    from p2plearn.bench.models import model_tensors

    rt = p2plearn.init()
    model = torch.nn.Module()
    for name, tensor in model_tensors(model_name, megabytes).items():
        model.register_parameter(name.replace(".", "_"), torch.nn.Parameter(tensor))
    del tensor  # the optimizer moves the parameters into its buckets: the loop's last must not outlive that
    opt = p2plearn.DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model, rt)
    times = []
    for _ in range(rounds):
        before, cpu = opt.channel.stats()["bytes_sent"], time.process_time()
        opt.step()
        rs = opt.last_round
        times.append({"comm_s": rs.comm_s, "planned_s": rs.planned_s, "fanout": rs.fanout, "delivered": rs.delivered,
                      "uplink_bytes": opt.channel.stats()["bytes_sent"] - before, "retransmitted": rs.retransmitted,
                      "cpu_s": time.process_time() - cpu})
        profile.mark_steady(len(times))  # (bench average --profile: perf starts once every peer is past its warm-up)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    with open(os.path.join(out_dir, f"rank{rt.rank}.json"), "w") as f:
        json.dump({"rounds": times, "peak_rss_mb": peak_kib * 1024 / 1e6}, f)
    opt.close()


def run_config(topology: str, selection: str, fanout: int, megabytes: float, rounds: int,
               transport: str | None = None) -> dict:
    """transport None: emulated links (loopback); else that --transport-mode on the root testbed."""
    from p2plearn.topology import load

    topo = load(topology)
    n = sum(topo.slots(p) for p in topo.peers)
    where = ["--emulate"] if transport is None else ["--testbed", "--transport-mode", transport]
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "p2plearn.launch", "-np", str(n), "--topology", topology, *where,
               "--selection", selection, "--fanout", str(fanout), "--sync", "bsp", "--period", "1",
               "--compress", "none", "--",
               sys.executable, "-m", "p2plearn.bench.rounds", "--peer", out, str(megabytes), str(rounds)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode:
            raise RuntimeError(f"{selection}: the job failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        peers = [json.load(open(os.path.join(out, f"rank{r}.json")))["rounds"] for r in range(n)]
    warm = 2  # the first rounds include connection set-up and the first plan
    per_round = [max(p[i]["comm_s"] for p in peers) for i in range(warm, rounds)]
    planned = [peers[0][i]["planned_s"] for i in range(warm, rounds)]
    measured = statistics.median(per_round)
    return {"selection": selection, "fanout": fanout, "peers": n, "megabytes": megabytes, "transport": transport,
            "round_s": measured, "planned_s": statistics.median(planned),
            "measured_over_planned": measured / statistics.median(planned),
            "average_p": statistics.mean(peers[0][i]["fanout"] for i in range(warm, rounds)),
            "uplink_mb": statistics.mean(p[i]["uplink_bytes"] for p in peers for i in range(warm, rounds)) / 2**20,
            "uplink_mb_per_rank": [statistics.mean(p[i]["uplink_bytes"] for i in range(warm, rounds)) / 2**20
                                   for p in peers],
            "delivered": statistics.mean(p[i]["delivered"] for p in peers for i in range(warm, rounds)),
            "retransmitted": statistics.mean(p[i]["retransmitted"] for p in peers for i in range(warm, rounds))}


def transport_main(args: argparse.Namespace) -> None:
    fanouts = [int(f) for f in args.fanouts.split(",")]
    results = [run_config(args.topology, "ring", p, args.megabytes, args.rounds, mode)
               for p in fanouts for mode in args.modes.split(",")]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{args.topology} testbed, {args.megabytes:g} MB messages, ring selection, BSP, {args.rounds} rounds\n")
    print("| p | transport | round time s (median) | x unicast | planned T s | measured / planned | "
          "uplink MB per peer per round | datagrams resent per peer per round | delivered |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        base = next(u["round_s"] for u in results if u["fanout"] == r["fanout"] and u["transport"] == "unicast")
        print(f"| {r['fanout']} | {r['transport']} | {r['round_s']:.3f} | {r['round_s'] / base:.2f} | "
              f"{r['planned_s']:.3f} | {r['measured_over_planned']:.2f} | {r['uplink_mb']:.2f} | "
              f"{r['retransmitted']:.0f} | {r['delivered']:.3f} |")
    ranks = range(results[0]["peers"])
    print("\nUplink MB per round, per rank (mean over rounds)\n")
    print("| p | transport | " + " | ".join(f"rank {r}" for r in ranks) + " |")
    print("|---|---|" + "---|" * len(ranks))
    for r in results:
        cells = " | ".join(f"{mb:.2f}" for mb in r["uplink_mb_per_rank"])
        print(f"| {r['fanout']} | {r['transport']} | {cells} |")


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--peer":
        return peer_main(argv[1], float(argv[2]), int(argv[3]), *argv[4:5])
    ap = argparse.ArgumentParser(prog="python -m p2plearn.bench rounds", description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--topology", help="topology file, one peer per node (default: topology/heterogeneous-8.json, "
                                       "with --transport topology/homogeneous-8.json)")
    ap.add_argument("--megabytes", type=float, default=1.0, help="message size per peer (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=30, help="rounds per configuration (default: %(default)s)")
    ap.add_argument("--fanout", type=int, default=2, help="receivers per sender, p (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON instead of a table")
    ap.add_argument("--transport", action="store_true", help="transport modes (--modes) compared on the root testbed")
    ap.add_argument("--fanouts", default="1,3,7", help="--transport: the values of p (default: %(default)s)")
    ap.add_argument("--modes", default="unicast,multicast",
                    help="--transport: the --transport-mode values, unicast first (auto: mixed networks, see "
                         "topology/mixed-8.json) (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.transport:
        args.topology = args.topology or "topology/homogeneous-8.json"
        return transport_main(args)
    args.topology = args.topology or "topology/heterogeneous-8.json"
    results = [run_config(args.topology, sel, args.fanout, args.megabytes, args.rounds)
               for sel in ("random", "selmcast")]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    base = results[0]["round_s"]
    print(f"{args.topology}, {args.megabytes:g} MB messages, p={args.fanout}, BSP, {args.rounds} rounds (emulated)\n")
    print("| selection | average p | round time s (median) | x random | planned T s | measured / planned |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['selection']} | {r['average_p']:.2f} | {r['round_s']:.3f} | {r['round_s'] / base:.2f} | "
              f"{r['planned_s']:.3f} | {r['measured_over_planned']:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
