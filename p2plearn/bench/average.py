"""One full average of a model among n peers: p2plearn's rounds against gloo's all_reduce, in one run.

    sudo python -m p2plearn.bench average [--topologies loopback,homogeneous-4,heterogeneous-4,lossy-4,
                                          homogeneous-8,incast-8] [--megabytes 10] [--rounds 8] [--json]
    sudo python -m p2plearn.bench average --model gpt2-small --topologies loopback,homogeneous-4 --rounds 5 \
                                          --modes partitioned,"partitioned fp16"
    python -m p2plearn.bench average --topologies loopback --rounds 60 --profile   [where the CPU goes: perf]

For each topology, jobs average a model, --rounds times, with no computation between: one float32
tensor of --megabytes MiB (--model flat), or GPT-2 small's 148 tensors (--model gpt2-small: 124.4M
parameters, 498 MB). gloo: torch.distributed's ring ``all_reduce`` (one process per rank) of DDP's
25 MiB buckets, the tensors being views into them (gradient_as_bucket_view): few large messages and
no copies, the cheapest way gloo has to average many tensors. p2plearn (--modes): ``--sync
partitioned`` (each peer aggregates a part sized by its bandwidth), ``--sync bsp --selection all``
(every peer multicasts its whole model to every other), and with half the bytes on the wire
``--sync partitioned --compress fp16``, against gloo's all_reduce of float16 buckets (what DDP's
``fp16_compress_hook`` sends). The p2plearn peers go through ``DecentralizedOptimizer``'s round with
the model's own tensors (``p2plearn.bench.rounds --peer``). As root every job runs on the testbed
(network namespaces shaped to the topology; gloo with GLOO_SOCKET_IFNAME); otherwise p2plearn runs
``--emulate`` (paced to the topology on loopback) and gloo on unshaped loopback, which favours gloo,
and the table says so. "loopback" is a topology too: both unshaped, 4 peers.

A round's time is the slowest rank's; the table gives the median over rounds after the first two
(connection set-up), the CPU seconds of all ranks' processes together per round per 100 MB of model
(every thread; p2plearn's launcher and coordinator not counted), each one's ratio to gloo float32's,
and the peak RSS of the largest rank. Targets (issues 15, 30): <= 1.0x gloo on clean networks, <= 0.5x
under loss and incast; 125M parameters <= 1.5x gloo on loopback, 10 MiB <= 2x, <= 1.05x on
homogeneous-4; peak RSS per peer <= the model's size x (1 + what the options keep) + 200 MB.
Memory: the gpt2-small row needs ~1 GB per gloo rank and more per p2plearn peer, 4 of each in turn.

--profile: each job's processes are also recorded with perf for --profile-seconds of the rounds after
the warm-up, and a second table gives each phase's share of their CPU (page faults, kernel copies,
tags, memcpy, merge, engine, numpy, Python: bench.profile); give enough --rounds to fill the window.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from p2plearn.bench import profile
from p2plearn.bench.models import MODELS, model_bytes, model_shapes

ROOT = Path(__file__).resolve().parents[2]
WARM = 2  # rounds that include connection set-up
MODES = {"partitioned": ["--sync", "partitioned", "--compress", "none"],  # float32, as gloo's all_reduce
         "bsp all": ["--sync", "bsp", "--selection", "all", "--compress", "none"],
         "partitioned fp16": ["--sync", "partitioned", "--compress", "fp16"],
         "partitioned int4": ["--sync", "partitioned", "--compress", "int4"]}
GLOO_DTYPES = ("float32", "float16")  # fp16 all_reduce: what DDP's fp16_compress_hook sends
BUCKET_MB = 25  # DDP's default bucket_cap_mb


def gloo_peer(out: str, model: str, megabytes: float, rounds: int, dtype: str) -> None:
    """One rank: `rounds` all_reduces of the model's tensors (bench.models; sent as `dtype`), in
    DDP's form: the tensors are views into buckets of BUCKET_MB, one all_reduce per bucket (no
    copies in or out, a few large messages: gloo's cheapest way to average many tensors). Rank 0
    writes the slowest rank's time per round, every rank's CPU seconds per round and peak RSS."""
    import resource

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    kind = getattr(torch, dtype)
    buckets = [torch.ones(count, dtype=kind)
               for count in bucket_sizes(list(model_shapes(model, megabytes).values()), kind.itemsize)]
    times, cpu = [], []
    for _ in range(rounds):
        dist.barrier()  # every rank starts the round together, as BSP peers do
        t0, c0 = time.monotonic(), time.process_time()
        for bucket in buckets:
            dist.all_reduce(bucket)
            bucket /= dist.get_world_size()
        times.append(time.monotonic() - t0)
        cpu.append(time.process_time() - c0)
        profile.mark_steady(len(times))
    slowest = torch.tensor(times)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    mine = torch.tensor([*cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6], dtype=torch.float64)
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"round_s": slowest.tolist(),
                                         "cpu_s": [sum(float(e[i]) for e in everyone) for i in range(rounds)],
                                         "peak_rss_mb": max(float(e[-1]) for e in everyone)}))
    dist.destroy_process_group()


def bucket_sizes(shapes: list[tuple[int, ...]], itemsize: int) -> list[int]:
    """Elements per bucket as DDP packs tensors of these shapes: consecutive tensors up to BUCKET_MB
    (a larger tensor alone). With gradient_as_bucket_view the model's tensors are views into the
    buckets, so an average is the buckets' all_reduces and nothing else."""
    limit, sizes = BUCKET_MB * 2**20, [0]
    for shape in shapes:
        count = math.prod(shape)
        if sizes[-1] and (sizes[-1] + count) * itemsize > limit:
            sizes.append(0)
        sizes[-1] += count
    return sizes


def topology_file(name: str) -> Path:
    return ROOT / "topology" / f"{name}.json"


def gloo_job(topology: str, n: int, model: str, megabytes: float, rounds: int, testbed: bool,
             dtype: str, extra_env: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="p2pbench-") as tmp:
        out = Path(tmp) / "gloo.json"
        argv = [sys.executable, "-m", "p2plearn.bench.average", "--gloo-peer", str(out), model, str(megabytes),
                str(rounds), dtype]
        env = {**extra_env, "WORLD_SIZE": str(n), "MASTER_PORT": "29710", "OMP_NUM_THREADS": "1"}
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


def p2plearn_job(topology: str, n: int, mode: str, model: str, megabytes: float, rounds: int, testbed: bool,
                 extra_env: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="p2pbench-") as out:
        network = [] if topology == "loopback" else ["--topology", str(topology_file(topology)),
                                                     "--testbed" if testbed else "--emulate"]
        cmd = [sys.executable, "-m", "p2plearn.launch", "-np", str(n), *network, *MODES[mode], "--period", "1", "--",
               sys.executable, "-m", "p2plearn.bench.rounds", "--peer", out, str(megabytes), str(rounds), model]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env={**os.environ, **extra_env})
        if proc.returncode:
            raise RuntimeError(f"p2plearn {mode} on {topology}: the job failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        peers = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(n)]
    return {"round_s": [max(p["rounds"][i]["comm_s"] for p in peers) for i in range(rounds)],
            "cpu_s": [sum(p["rounds"][i]["cpu_s"] for p in peers) for i in range(rounds)],
            "peak_rss_mb": max(p["peak_rss_mb"] for p in peers)}


def summarise(measured: dict, model_bytes: int) -> dict:
    """Medians over the rounds after WARM: round seconds, and CPU seconds of all ranks together
    per round per 100 MB of model; the peak RSS of the largest rank."""
    return {"round_s": statistics.median(measured["round_s"][WARM:]),
            "cpu_s_per_100mb": statistics.median(measured["cpu_s"][WARM:]) / (model_bytes / 1e8),
            "peak_rss_mb": measured["peak_rss_mb"]}


def peers_of(topology: str) -> int:
    if topology == "loopback":
        return 4
    from p2plearn.topology import load

    topo = load(topology_file(topology))
    return sum(topo.slots(p) for p in topo.peers)


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--gloo-peer":
        return gloo_peer(argv[1], argv[2], float(argv[3]), int(argv[4]), argv[5])
    ap = argparse.ArgumentParser(prog="python -m p2plearn.bench average", description=__doc__.splitlines()[0])
    ap.add_argument("--topologies", default="loopback,homogeneous-4,heterogeneous-4,lossy-4,homogeneous-8,incast-8",
                    help="comma-separated names of topology/*.json files, or loopback (default: %(default)s)")
    ap.add_argument("--model", choices=MODELS, default="flat",
                    help="flat: one tensor of --megabytes; gpt2-small: GPT-2 small's 148 tensors, 124.4M "
                         "parameters, 498 MB (default: %(default)s)")
    ap.add_argument("--megabytes", type=float, default=10.0,
                    help="--model flat: its size in MiB of float32 (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=8,
                    help=f"averages per job, the first {WARM} not counted (default: %(default)s)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated p2plearn modes to run (default: %(default)s)")
    ap.add_argument("--gloo-dtypes", default=",".join(GLOO_DTYPES),
                    help="comma-separated dtypes of gloo's all_reduce (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON instead of a table")
    profile.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.rounds <= WARM:
        ap.error(f"--rounds must be more than the {WARM} warm-up rounds")
    modes, dtypes = args.modes.split(","), args.gloo_dtypes.split(",")
    unknown = [m for m in modes if m not in MODES] + [d for d in dtypes if d not in GLOO_DTYPES]
    if unknown or "float32" not in dtypes:
        ap.error(f"unknown mode or dtype {unknown} (modes: {', '.join(MODES)}; dtypes: {', '.join(GLOO_DTYPES)}, "
                 f"float32 among them: the ratios are to it)")
    testbed = os.geteuid() == 0
    size = model_bytes(args.model, args.megabytes)
    profiling = profile.wanted(args)
    results, profiles = [], []
    for topology in args.topologies.split(","):
        n = peers_of(topology)
        jobs = [(f"gloo {dtype}", lambda env, dtype=dtype: gloo_job(topology, n, args.model, args.megabytes, args.rounds,
                                                                    testbed, dtype, env)) for dtype in dtypes]
        jobs += [(f"p2plearn {mode}", lambda env, mode=mode: p2plearn_job(topology, n, mode, args.model, args.megabytes,
                                                                          args.rounds, testbed, env)) for mode in modes]
        for system, job in jobs:
            prof = profile.Profile(n, WARM, args.profile_seconds, args.profile_dir,
                                   name=f"{topology}-{system}".replace(" ", "-")) if profiling else None
            with prof or contextlib.nullcontext():
                measured = job(prof.env if prof else {})
            results.append({"topology": topology, "peers": n, "system": system, **summarise(measured, size),
                            **({"profile": prof.shares, "profile_note": prof.note} if prof else {})})
            profiles.append((f"{topology}: {system}", prof))
            print(f"  {results[-1]}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    where = ("testbed (root: namespaces shaped to each topology)" if testbed else
             "emulated p2plearn vs gloo on unshaped loopback (not root: favours gloo)")
    what = (f"{args.megabytes:g} MiB (one float32 tensor)" if args.model == "flat" else
            f"{args.model} ({size / 1e6:.0f} MB of float32 in its own tensor shapes)")
    print(f"One full average of {what}, median of {args.rounds - WARM} rounds; {where}. gloo: all_reduce of "
          f"DDP's {BUCKET_MB} MiB buckets (float16: DDP's fp16_compress_hook). CPU: seconds of all ranks' processes "
          f"together per round per 100 MB of model (p2plearn: the peers, launcher and coordinator not counted). "
          f"Peak RSS: the largest rank's.\n")
    print("| network | peers | system | round s | x gloo float32 | CPU s / round / 100 MB | x gloo float32 "
          "| peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        base = next(b for b in results if b["topology"] == r["topology"] and b["system"] == "gloo float32")
        print(f"| {r['topology']} | {r['peers']} | {r['system']} | {r['round_s']:.3f} | "
              f"{r['round_s'] / base['round_s']:.2f} | {r['cpu_s_per_100mb']:.3f} | "
              f"{r['cpu_s_per_100mb'] / base['cpu_s_per_100mb']:.2f} | {r['peak_rss_mb']:.0f} |")
    if profiling:
        profile.print_table(profiles, f"each job's {'ranks' if testbed else 'processes'} (launcher and coordinator not counted)")


if __name__ == "__main__":
    main(sys.argv[1:])
