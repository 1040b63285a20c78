"""Baselines for time_to_accuracy.py: the MNIST-1D example's model, data and shards trained with what
torch itself offers, one process per rank:

- ``--mode ddp``: DistributedDataParallel, a gloo all_reduce of the gradients every step;
- ``--mode local-sgd``: torch's local SGD: each rank steps alone and every ``--period`` steps
  ``PeriodicModelAverager`` all-reduces the parameters (gloo), as p2plearn's ``--period`` does;
- ``--mode single``: one process on the whole training set, no communication.

    RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p [GLOO_SOCKET_IFNAME=if] \\
        python experiments/torch_mnist1d.py --mode local-sgd --period 16 --model mlp --json out.json

Same flags and JSON fields as `p2plearn.examples.mnist1d` where they apply (rank 0 writes them).
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.nn.parallel import DistributedDataParallel

from p2plearn.examples.mnist1d import add_model_arguments, make_model
from p2plearn.train.data import accuracy, mnist1d, shard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(ap)
    ap.add_argument("--mode", choices=("ddp", "local-sgd", "single"), default="ddp")
    ap.add_argument("--period", type=int, default=16, help="local-sgd: steps between parameter averages")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="stop once rank 0 has trained this long (checked with the ranks at each exchange)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    distributed = args.mode != "single"
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(args.seed)
    model = make_model(args)
    trained = DistributedDataParallel(model) if args.mode == "ddp" else model
    averager = PeriodicModelAverager(period=args.period, warmup_steps=0) if args.mode == "local-sgd" else None
    data = mnist1d(args.samples)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if distributed:
        dist.barrier()
    start, history, steps, averages = time.monotonic(), [], 0, 0
    exchange_every = args.period if args.mode == "local-sgd" else 1

    def over_budget(step: int) -> bool:
        """Rank 0's clock decides, at exchange steps, so that every rank stops at the same step."""
        if step % exchange_every:
            return False
        stop = torch.tensor([float(rank == 0 and time.monotonic() - start >= args.budget_s)])
        if distributed:
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        return bool(stop.item())

    def evaluate() -> None:
        history.append((time.monotonic() - start, accuracy(model, data.x_test, data.y_test)))

    stopped = False
    for epoch in range(args.epochs):
        for x, y in shard(data, args.batch_size, rank=rank, world_size=world, epoch=epoch, seed=args.seed,
                          dirichlet=args.dirichlet):
            loss = F.cross_entropy(trained(x), y)
            loss.backward()
            opt.step()
            steps += 1
            if averager is not None:  # before zero_grad: it averages only parameters that have a gradient
                averager.average_parameters(model.parameters())
                averages += steps % args.period == 0
            opt.zero_grad()
            if args.eval_every and steps % args.eval_every == 0:
                evaluate()
            if args.budget_s and over_budget(steps):
                stopped = True
                break
        if not args.eval_every:
            evaluate()
        if rank == 0 and history:
            print(f"epoch {epoch + 1}: test accuracy {history[-1][1]:.3f}, {history[-1][0]:.1f} s", flush=True)
        if stopped:
            break
    if args.eval_every and steps % args.eval_every:
        evaluate()  # the model as training left it
    wall = time.monotonic() - start
    averaged = history[-1][1]
    if args.mode == "local-sgd":  # the average of the ranks' last models, as p2plearn's average_model gives
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.data)
                p.data /= world
        averaged = accuracy(model, data.x_test, data.y_test)
    # what a ring all_reduce puts on each rank's uplink: 2 (n-1)/n of the message
    exchanges = {"ddp": steps, "local-sgd": averages, "single": 0}[args.mode]
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"averaged_accuracy": averaged, "own_accuracy": history[-1][1], "wall_s": wall,
                       "rounds": exchanges, "steps": steps,
                       "bytes_sent": int(exchanges * 2 * size * (world - 1) / world), "history": history}, f)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
