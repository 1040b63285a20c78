"""A standard torch training loop under p2plearn, for the resume test: an MLP with BatchNorm and
dropout, SGD with momentum, a StepLR scheduler, a GradScaler, a checkpoint at every epoch.

    p2plearn-run -np 2 [--resume CKPT] -- python tests/train/resume_peer.py --ckpt CKPT --out OUT
        [--epochs 3] [--stop-after K]

--stop-after K exits after the checkpoint of epoch K (a stopped job); rank r writes its final
model state to OUT/final-rank-r.pt.
"""
import argparse
import os

import torch
import torch.nn.functional as F

import p2plearn

ap = argparse.ArgumentParser()
ap.add_argument("--ckpt", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--stop-after", type=int)
args = ap.parse_args()

torch.set_num_threads(1)  # the same kernels on every run: bit-exact comparisons
rt = p2plearn.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                            torch.nn.Dropout(0.1), torch.nn.Linear(32, 10))
opt = p2plearn.DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model, rt)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
scaler = torch.amp.GradScaler("cpu")
data = p2plearn.data.digits()
start = p2plearn.checkpoint.load(None, model, opt, scheduler=sched, scaler=scaler) or {}
for epoch in range(start.get("epoch", 0), args.epochs):
    for x, y in p2plearn.data.shard(data, batch_size=16, epoch=epoch):
        loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    sched.step()
    p2plearn.checkpoint.save(args.ckpt, model, opt, scheduler=sched, scaler=scaler, epoch=epoch + 1)
    print(f"rank {rt.rank}: epoch {epoch + 1} saved at step {opt.steps}, round {opt.sync.clock}", flush=True)
    if args.stop_after == epoch + 1:
        break
else:
    torch.save(model.state_dict(), os.path.join(args.out, f"final-rank-{rt.rank}.pt"))
opt.close()
