"""One full average of a model among n peers: p2plearn's rounds against gloo's all_reduce, in one run.

    sudo python -m p2plearn.bench average [--topologies homogeneous-4,heterogeneous-4,lossy-4,homogeneous-8]
                                          [--megabytes 10] [--rounds 8] [--json]

For each topology, five jobs average a model of --megabytes (MiB of float32), --rounds times, with no
computation between: torch.distributed's gloo ``all_reduce`` (ring; one process per rank), p2plearn
``--sync partitioned`` (each peer aggregates a part sized by its bandwidth) and p2plearn ``--sync bsp
--selection all`` (every peer multicasts its whole model to every other); and with half the bytes on
the wire, gloo's all_reduce of the model as float16 (what DDP's ``fp16_compress_hook`` does) and
p2plearn ``--sync partitioned --compress fp16``. As root every job runs on
the testbed (network namespaces shaped to the topology; gloo with GLOO_SOCKET_IFNAME); otherwise
p2plearn runs ``--emulate`` (paced to the topology on loopback) and gloo on unshaped loopback, which
favours gloo, and the table says so. "loopback" is a topology too: both unshaped, 4 peers.
A round's time is the slowest rank's; the table gives the median over rounds after the first two
(connection set-up) and each p2plearn mode's ratio to gloo's. Targets (issue 15): <= 1.0x gloo on
clean networks, <= 0.5x under loss and incast.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WARM = 2  # rounds that include connection set-up
MODES = {"partitioned": ["--sync", "partitioned"], "bsp all": ["--sync", "bsp", "--selection", "all"],
         "partitioned fp16": ["--sync", "partitioned", "--compress", "fp16"]}
GLOO_DTYPES = ("float32", "float16")  # fp16 all_reduce: what DDP's fp16_compress_hook sends


def gloo_peer(out: str, megabytes: float, rounds: int, dtype: str) -> None:
    """One rank: `rounds` all_reduces of a model of `megabytes` float32 (sent as `dtype`); rank 0
    writes the times."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    tensor = torch.ones(int(megabytes * 2**20 / 4), dtype=getattr(torch, dtype))  # as bench.rounds' model
    times = []
    for _ in range(rounds):
        dist.barrier()  # every rank starts the round together, as BSP peers do
        t0 = time.monotonic()
        dist.all_reduce(tensor)
        tensor /= dist.get_world_size()
        times.append(time.monotonic() - t0)
    slowest = torch.tensor(times)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(slowest.tolist()))
    dist.destroy_process_group()


def topology_file(name: str) -> Path:
    return ROOT / "topology" / f"{name}.json"


def gloo_job(topology: str, n: int, megabytes: float, rounds: int, testbed: bool, dtype: str) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="p2pbench-") as tmp:
        out = Path(tmp) / "gloo.json"
        argv = [sys.executable, "-m", "p2plearn.bench.average", "--gloo-peer", str(out), str(megabytes), str(rounds),
                dtype]
        env = {"WORLD_SIZE": str(n), "MASTER_PORT": "29710", "OMP_NUM_THREADS": "1"}
        if testbed and topology != "loopback":
            from p2plearn.testbed import Testbed

            with Testbed(topology_file(topology), name="benchavg") as tb:
                procs = [tb.run(i, argv, env={**env, "RANK": str(i), "MASTER_ADDR": tb.address(0),
                                              "GLOO_SOCKET_IFNAME": tb.interface(i)}, cwd=ROOT) for i in range(n)]
                codes = [p.wait(timeout=900) for p in procs]
        else:
            procs = [subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env, "RANK": str(i),
                                                            "MASTER_ADDR": "127.0.0.1"}) for i in range(n)]
            codes = [p.wait(timeout=900) for p in procs]
        if any(codes) or not out.exists():
            raise RuntimeError(f"gloo on {topology}: a rank failed (exit codes {codes})")
        return json.loads(out.read_text())


def p2plearn_job(topology: str, n: int, mode: str, megabytes: float, rounds: int, testbed: bool) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="p2pbench-") as out:
        network = [] if topology == "loopback" else ["--topology", str(topology_file(topology)),
                                                     "--testbed" if testbed else "--emulate"]
        cmd = [sys.executable, "-m", "p2plearn.launch", "-np", str(n), *network, *MODES[mode], "--period", "1", "--",
               sys.executable, "-m", "p2plearn.bench.rounds", "--peer", out, str(megabytes), str(rounds)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
        if proc.returncode:
            raise RuntimeError(f"p2plearn {mode} on {topology}: the job failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        peers = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(n)]
    return [max(p[i]["comm_s"] for p in peers) for i in range(rounds)]


def peers_of(topology: str) -> int:
    if topology == "loopback":
        return 4
    from p2plearn.topology import load

    topo = load(topology_file(topology))
    return sum(topo.slots(p) for p in topo.peers)


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--gloo-peer":
        return gloo_peer(argv[1], float(argv[2]), int(argv[3]), argv[4])
    ap = argparse.ArgumentParser(prog="python -m p2plearn.bench average", description=__doc__.splitlines()[0])
    ap.add_argument("--topologies", default="loopback,homogeneous-4,heterogeneous-4,lossy-4,homogeneous-8",
                    help="comma-separated names of topology/*.json files, or loopback (default: %(default)s)")
    ap.add_argument("--megabytes", type=float, default=10.0, help="model size in MiB of float32 (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=8,
                    help=f"averages per job, the first {WARM} not counted (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON instead of a table")
    args = ap.parse_args(argv)
    if args.rounds <= WARM:
        ap.error(f"--rounds must be more than the {WARM} warm-up rounds")
    testbed = os.geteuid() == 0
    results = []
    for topology in args.topologies.split(","):
        n = peers_of(topology)
        row = {"topology": topology, "peers": n}
        for dtype in GLOO_DTYPES:
            row[f"gloo {dtype}_s"] = statistics.median(gloo_job(topology, n, args.megabytes, args.rounds, testbed,
                                                                dtype)[WARM:])
        for mode in MODES:
            row[f"{mode}_s"] = statistics.median(p2plearn_job(topology, n, mode, args.megabytes, args.rounds,
                                                              testbed)[WARM:])
        results.append(row)
        print(f"  {row}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    where = ("testbed (root: namespaces shaped to each topology)" if testbed else
             "emulated p2plearn vs gloo on unshaped loopback (not root: favours gloo)")
    print(f"One full average of {args.megabytes:g} MB (float32), median of {args.rounds - WARM} rounds; {where}\n")
    print("float32 on the wire: gloo all_reduce vs p2plearn partitioned and bsp all; float16 on the wire: gloo "
          "all_reduce of a float16 tensor (DDP's fp16_compress_hook) vs p2plearn partitioned --compress fp16\n")
    print("| network | peers | gloo s | partitioned s | x gloo | bsp all s | x gloo "
          "| gloo fp16 s | partitioned fp16 s | x gloo fp16 | x gloo |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        gloo, half = r["gloo float32_s"], r["gloo float16_s"]
        print(f"| {r['topology']} | {r['peers']} | {gloo:.3f} | {r['partitioned_s']:.3f} | "
              f"{r['partitioned_s'] / gloo:.2f} | {r['bsp all_s']:.3f} | {r['bsp all_s'] / gloo:.2f} | {half:.3f} | "
              f"{r['partitioned fp16_s']:.3f} | {r['partitioned fp16_s'] / half:.2f} | "
              f"{r['partitioned fp16_s'] / gloo:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
