"""One rank of experiments/ddp_vs_gloo.py: the MNIST-1D example's model trained with DDP, a gradient
all-reduce every step, over gloo or over the p2plearn backend (exact, or the loss-tolerant hook).

    RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p [GLOO_SOCKET_IFNAME=if] [P2PLEARN_ENGINE_HOST=ip] \\
        python experiments/ddp_peer.py --backend p2plearn --tolerance fixed --bound 0.05 --json out.json

Rank 0 writes each step's wall time (forward, backward and the wait for the last bucket, optimizer
step), its test accuracy every --eval-every steps (time excluding evaluation) and what the hook's
rounds delivered.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import p2plearn  # noqa: F401  (after torch: registers the backend)
import p2plearn.ddp
from p2plearn.examples.mnist1d import add_model_arguments, make_model
from p2plearn.train.data import accuracy, mnist1d, shard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(ap)
    ap.add_argument("--backend", choices=("gloo", "p2plearn"), default="p2plearn")
    ap.add_argument("--tolerance", choices=("none", "fixed", "adaptive", "layerwise", "phase"), default="none",
                    help="none: DDP's own all-reduce (exact); else the loss-tolerant hook with this policy")
    ap.add_argument("--bound", type=float, default=0.05, help="fixed: the loss bound; layerwise: the target loss")
    ap.add_argument("--hadamard", action="store_true", help="the hook's randomized Hadamard transform")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: --epochs)")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = make_model(args)
    trained = DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    state = None
    if args.tolerance != "none":
        policy_args = {"fixed": {"loss_bound": args.bound}, "layerwise": {"target_loss": args.bound}}.get(args.tolerance, {})
        state = p2plearn.ddp.LossTolerantState(args.tolerance, model=model, hadamard=args.hadamard, seed=args.seed,
                                               **policy_args)
        trained.register_comm_hook(state, p2plearn.ddp.loss_tolerant_hook)
    data = mnist1d(args.samples)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    dist.barrier()
    step_s, history, steps, evaluating = [], [], 0, 0.0
    start = time.monotonic()
    for epoch in range(args.epochs):
        for x, y in shard(data, args.batch_size, rank=rank, world_size=world, epoch=epoch, seed=args.seed,
                          dirichlet=args.dirichlet):
            t0 = time.monotonic()
            loss = F.cross_entropy(trained(x), y)
            loss.backward()  # returns once DDP's last bucket is averaged
            opt.step()
            opt.zero_grad()
            step_s.append(time.monotonic() - t0)
            steps += 1
            if state is not None:
                state.report(loss=loss.item())  # the phase policy's input (the same kind on every rank)
            if rank == 0 and args.eval_every and steps % args.eval_every == 0:
                t1 = time.monotonic()
                history.append((t1 - start - evaluating, accuracy(model, data.x_test, data.y_test)))
                evaluating += time.monotonic() - t1
            if args.steps and steps >= args.steps:
                break
        if args.steps and steps >= args.steps:
            break
    wall = time.monotonic() - start - evaluating
    final = accuracy(model, data.x_test, data.y_test)
    if rank == 0 and args.json:
        records = state.records() if state is not None else []
        with open(args.json, "w") as f:
            json.dump({"final_accuracy": final, "wall_s": wall, "steps": steps, "step_s": step_s, "history": history,
                       "delivered": [r.delivered for r in records], "deadline_hits": sum(r.deadline_hit for r in records),
                       "parameters": sum(p.numel() for p in model.parameters())}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
