"""DDP on CUDA: the per-step time over the p2plearn backend against gloo's, in the same job.

    for r in 0 1; do RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29541 \\
        python experiments/ddp_gpu_step.py --json out.json & done; wait

Each rank trains an MLP of LAYERS x WIDTH^2 parameters (float32, on its GPU: cuda:LOCAL_RANK modulo
the GPUs there) with DDP (25 MiB buckets) and SGD, batch 256 of random data, first over the default
group (the p2plearn backend: a CUDA bucket goes through pinned host copies) and then over a gloo
group of the same ranks (gloo stages CUDA tensors the same way); rank 0 prints and writes the
median step time of STEPS steps after WARMUP, each step synchronized.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import p2plearn  # noqa: F401  (registers the backend)

LAYERS, WIDTH, WARMUP, STEPS = 6, 2048, 3, 20


def step_times(ddp: torch.nn.Module, device: torch.device) -> list[float]:
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(256, WIDTH, device=device)
    times = []
    for _ in range(WARMUP + STEPS):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return times[WARMUP:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="rank 0 writes the medians here")
    args = ap.parse_args()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", os.environ["RANK"])) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("p2plearn")
    gloo = dist.new_group(backend="gloo")
    out = {"parameters": LAYERS * (WIDTH * WIDTH + WIDTH), "world_size": dist.get_world_size(),
           "device": torch.cuda.get_device_name(device)}
    for name, group in (("p2plearn", None), ("gloo", gloo)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]).to(device)
        out[f"{name}_step_s"] = statistics.median(step_times(DDP(model, process_group=group), device))
    if dist.get_rank() == 0:
        out["ratio"] = out["p2plearn_step_s"] / out["gloo_step_s"]
        print(json.dumps(out))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
