"""Baseline for charlm_time_to_loss.py: the charlm example's model, data, shards, optimizer and loop
(``p2plearn.examples.charlm.train``) with torch's local SGD: each rank steps alone and every
``--period`` steps ``PeriodicModelAverager`` all-reduces the parameters (gloo), as p2plearn's
``--period`` does.

    RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p [GLOO_SOCKET_IFNAME=if] \\
        python experiments/torch_charlm.py --period 16 --steps 300 --json out.json

Same flags and JSON fields as `p2plearn.examples.charlm` where they apply (rank 0 writes them).
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from p2plearn.examples.charlm import add_model_arguments, make_model, make_optimizer, train, validation_loss
from p2plearn.train.data import stdlib_text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(ap)
    ap.add_argument("--period", type=int, default=16, help="steps between parameter averages")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(args)
    data = stdlib_text(args.context, int(args.corpus_mb * 1e6))
    opt = make_optimizer(args, model)
    averager = PeriodicModelAverager(period=args.period, warmup_steps=0)

    def step(_: torch.Tensor) -> None:
        opt.step()
        averager.average_parameters(model.parameters())  # before zero_grad: it averages parameters with a gradient
        opt.zero_grad()

    dist.barrier()
    history = train(args, model, data, rank, world, step)
    own = history[-1][1]
    with torch.no_grad():  # the average of the ranks' last models, as p2plearn's average_model gives
        for p in model.parameters():
            dist.all_reduce(p.data)
            p.data /= world
    averaged = validation_loss(model, data, args.eval_windows, args.device)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    rounds = args.steps // args.period
    if rank == 0 and args.json:
        with open(args.json, "w") as f:  # bytes: what a ring all_reduce puts on each uplink, 2 (n-1)/n of the model
            json.dump({"averaged_loss": averaged, "own_loss": own, "wall_s": history[-1][0], "steps": args.steps,
                       "rounds": rounds, "bytes_sent": int(rounds * 2 * size * (world - 1) / world),
                       "history": history}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
