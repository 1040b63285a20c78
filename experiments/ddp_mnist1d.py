"""Baseline for time_to_accuracy.py: the MNIST-1D example's model, data and shards trained with torch
DDP (gloo all_reduce of the gradients every step), one process per rank.

    RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p [GLOO_SOCKET_IFNAME=if] \\
        python experiments/ddp_mnist1d.py --epochs 6 --model mlp --json out.json

Same flags and JSON fields as `p2plearn.examples.mnist1d` where they apply (rank 0 writes them).
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from p2plearn.examples.mnist1d import add_model_arguments, make_model
from p2plearn.train.data import accuracy, mnist1d, shard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(make_model(args))
    data = mnist1d(args.samples)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    dist.barrier()
    start, history, rounds = time.monotonic(), [], 0
    for epoch in range(args.epochs):
        for x, y in shard(data, args.batch_size, rank=rank, world_size=world, epoch=epoch, seed=args.seed):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            rounds += 1
        acc = accuracy(model.module, data.x_test, data.y_test)
        history.append((time.monotonic() - start, acc))
        if rank == 0:
            print(f"epoch {epoch + 1}: test accuracy {acc:.3f}, {history[-1][0]:.1f} s", flush=True)
    wall = time.monotonic() - start
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"averaged_accuracy": history[-1][1], "own_accuracy": history[-1][1], "wall_s": wall,
                       "rounds": rounds, "bytes_sent": int(rounds * 2 * size * (world - 1) / world),
                       "history": history}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
