"""CPU cost of a round against the number of tensors: the same bytes as 3 tensors or as 300.

    python experiments/round_cost.py [--megabytes 10] [--peers 2] [--rounds 12] [--bucket-mb 25]

Peers run as threads of this one process (a coordinator, a control client and an engine each),
on loopback; every step is a round (SGD with no gradients: the step itself does nothing), BSP
with every peer sending to every other. Prints, per model, the process CPU seconds per round
(all peers together, after 3 warm-up rounds) and the wall seconds per round. The engine's own
threads count in the CPU time; a round's Python work is what grows with the tensors.

Memory: the process's peak RSS over what it held before the first model was made, per peer
and parameter (the model's own bytes included): run one process per setting, e.g.
``--counts 300 --options overlap=true`` (options as the optimizer's keyword overrides).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import secrets
import threading
import time

import torch

from p2plearn.control import Client, Coordinator
from p2plearn.options import Options
from p2plearn.runtime import Runtime
from p2plearn.train import DecentralizedOptimizer

WARM = 3


class Tensors(torch.nn.Module):
    """`count` float32 parameters of `megabytes` MiB in all."""

    def __init__(self, count: int, megabytes: float):
        super().__init__()
        n = int(megabytes * 2**20 / 4 / count)
        self.tensors = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(n)) for _ in range(count))


def measure(count: int, megabytes: float, peers: int, rounds: int, profile: bool = False,
            **options) -> tuple[float, float, float]:
    """(CPU seconds, wall seconds, Python calls of rank 0's training thread) per round of `peers`
    peers averaging `count` tensors. The calls are counted (cProfile) only with `profile`, which
    slows rank 0: time and count in separate runs."""
    key, job = secrets.token_hex(16), "round-cost"
    coord = Coordinator(job, key, world_size=peers, heartbeat=0.2).start()
    clients = [Client(coord.address, job, key, rank=r, connect_timeout=10.0) for r in range(peers)]
    opts: list[DecentralizedOptimizer | None] = [None] * peers
    barrier = threading.Barrier(peers + 1)
    calls = [0.0]
    try:
        def peer(rank: int) -> None:
            clients[rank].register(None)
            rt = Runtime(rank=rank, world_size=peers, local_rank=0, local_world_size=1, job_id=job,
                         options=Options(sync="bsp", selection="all", fanout=peers - 1, period=1),
                         client=clients[rank])
            model = Tensors(count, megabytes)
            opts[rank] = opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model, rt,
                                                      **options)
            profiler = cProfile.Profile() if profile and rank == 0 else None
            for r in range(rounds):
                if r == WARM:
                    barrier.wait(60)  # the clock starts with every peer warm
                    if profiler:
                        profiler.enable()
                opt.step()
            if profiler:
                profiler.disable()
                calls[0] = pstats.Stats(profiler).total_calls / (rounds - WARM)
            barrier.wait(60)

        threads = [threading.Thread(target=peer, args=(r,), daemon=True) for r in range(peers)]
        for t in threads:
            t.start()
        barrier.wait(120)
        cpu0, wall0 = time.process_time(), time.monotonic()
        barrier.wait(600)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        for t in threads:
            t.join(60)
        return cpu / (rounds - WARM), wall / (rounds - WARM), calls[0]
    finally:
        for opt in opts:
            if opt is not None:
                opt.close()
        for client in clients:
            client.close()
        coord.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=10.0)
    parser.add_argument("--peers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--counts", default="3,300", help="tensor counts, comma-separated")
    parser.add_argument("--profile", action="store_true", help="count rank 0's Python calls per round (slows it)")
    parser.add_argument("--options", default="", help="optimizer overrides, e.g. bucket_mb=4,overlap=true,compress=fp16")
    args = parser.parse_args()
    options = dict(_option(item) for item in args.options.split(",") if item)
    print("| tensors | MiB | peers | options | CPU s / round | wall s / round | peak RSS bytes / parameter / peer "
          "| Python calls / round (rank 0) |")
    print("|---|---|---|---|---|---|---|---|")
    for count in map(int, args.counts.split(",")):
        before = _peak_rss()
        cpu, wall, calls = measure(count, args.megabytes, args.peers, args.rounds, args.profile, **options)
        per_param = (_peak_rss() - before) / (args.peers * args.megabytes * 2**20 / 4)
        print(f"| {count} | {args.megabytes:g} | {args.peers} | {args.options or '-'} | {cpu:.4f} | {wall:.4f} | "
              f"{per_param:.1f} | {calls:.0f} |", flush=True)


def _option(item: str) -> tuple[str, object]:
    name, _, text = item.partition("=")
    if text in ("true", "false"):
        return name, text == "true"
    for kind in (int, float):
        try:
            return name, kind(text)
        except ValueError:
            pass
    return name, text


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


if __name__ == "__main__":
    main()
