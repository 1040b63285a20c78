"""One peer of the fault-injection experiment (started by faults.py as torchrun starts peers).

    python experiments/fault_peer.py --seconds S --out DIR [--join --until T] [--seed N] [--eval-every E]

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, P2PLEARN_JOB_ID, P2PLEARN_JOB_KEY; rank 0
starts the coordinator's process. ``--join``: a fresh process joining the running job (it gets a
free rank and the model state from a donor; ``--until T``: stop at wall time T, with the others,
however long its start took). Trains the MNIST-1D CNN on its shard for S seconds
after the rendezvous, prints ``ready <rank> <pid> <coordinator pid or 0>`` when it starts, and
appends one JSON line per evaluation (every E seconds) to DIR/rank-R.jsonl: wall time, test
accuracy of its own model, its clock. The file is flushed per line, so a killed peer keeps what it
measured; at a clean end it appends its training summary.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import p2plearn
from p2plearn.examples.mnist1d import CNN
from p2plearn.train.data import accuracy, mnist1d, shard


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--join", action="store_true")
    ap.add_argument("--until", type=float, help="stop at this time.time() instead of --seconds after the start")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=float, default=2.0)
    ap.add_argument("--samples", type=int, default=6000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rt = p2plearn.init(join=args.join, timeout=180.0)
    torch.manual_seed(args.seed)  # every peer starts from the same model
    model = CNN(32)
    data = mnist1d(args.samples)
    opt = p2plearn.DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model, rt,
                                          seed=args.seed)
    coordinator_pid = rt.coordinator.proc.pid if rt.coordinator is not None else 0
    print(f"ready {rt.rank} {os.getpid()} {coordinator_pid}", flush=True)
    log = open(os.path.join(args.out, f"rank-{rt.rank}.jsonl"), "a")

    def record(**fields: object) -> None:
        log.write(json.dumps({"rank": rt.rank, "t": time.time(), **fields}) + "\n")
        log.flush()

    until = time.monotonic() + (args.until - time.time() if args.until else args.seconds)
    next_eval, epoch = 0.0, 0
    while time.monotonic() < until:
        for x, y in shard(data, 32, rank=rt.rank, world_size=rt.world_size, epoch=epoch, seed=args.seed):
            if time.monotonic() >= next_eval:
                record(accuracy=accuracy(model, data.x_test, data.y_test), clock=opt.sync.clock)
                next_eval = time.monotonic() + args.eval_every
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step(loss=loss)
            opt.zero_grad()
            if time.monotonic() >= until:
                break
        epoch += 1
    st = opt.stats()
    record(accuracy=accuracy(model, data.x_test, data.y_test), clock=opt.sync.clock, final=True,
           rounds=st.rounds, merges=st.merges, rejoins=st.rejoins, coordinator_changes=st.coordinator_changes,
           mixed_with=sorted(st.mixed_with))
    log.close()
    opt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
