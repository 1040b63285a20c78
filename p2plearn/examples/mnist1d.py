"""Decentralized training of a small CNN (or a wide MLP) on MNIST-1D (generated offline), one process per peer.

    p2plearn-run -np 4 --topology topology/heterogeneous-4.json --emulate -- \\
        python -m p2plearn.examples.mnist1d --sync bsp
    p2plearn-run -np 4 ... -- python -m p2plearn.examples.mnist1d --sync ssp --staleness 2

Each peer trains on its shard and averages with the peers of each round's plan. At the end
every peer reports its own test accuracy, and the root of the final average (rank 0, or the live
rank after it should rank 0 be gone) the accuracy of the averaged model.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
import torch.nn.functional as F
from torch import nn

import p2plearn
from p2plearn.transport.uplink import UplinkMeter
from p2plearn.options import Options
from p2plearn.train.data import accuracy, mnist1d, shard


class CNN(nn.Module):
    """Three 1-D convolutions and a linear head (~10k parameters at width 32)."""

    def __init__(self, width: int = 32, length: int = 40, classes: int = 10):
        super().__init__()
        self.c1 = nn.Conv1d(1, width, 5, padding=2)
        self.c2 = nn.Conv1d(width, width, 3, padding=1, stride=2)
        self.c3 = nn.Conv1d(width, width, 3, padding=1, stride=2)
        self.head = nn.Linear(width * ((length + 3) // 4), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.c1(x.unsqueeze(1)))
        x = F.relu(self.c2(x))
        x = F.relu(self.c3(x))
        return self.head(x.flatten(1))


class MLP(nn.Module):
    """Two hidden layers of `hidden` units: ~hidden^2 parameters, so that communication dominates
    (hidden 1536: 2.4M parameters, 9.7 MB per message) while compute stays small."""

    def __init__(self, hidden: int = 1536, length: int = 40, classes: int = 10):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(length, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                    nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def make_model(args: argparse.Namespace) -> nn.Module:
    """The model the flags name (--model, --width, --hidden)."""
    return CNN(args.width) if args.model == "cnn" else MLP(args.hidden)


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags shared with torch's baselines (experiments/torch_mnist1d.py): model, data, optimizer."""
    ap.add_argument("--model", choices=("cnn", "mlp"), default="cnn",
                    help="cnn: compute-heavy, small messages; mlp: few FLOPs, large messages (default: %(default)s)")
    ap.add_argument("--width", type=int, default=32, help="CNN channels: larger = more bytes per round (default: %(default)s)")
    ap.add_argument("--hidden", type=int, default=1536, help="MLP hidden units: parameters grow as hidden^2 (default: %(default)s)")
    ap.add_argument("--epochs", type=int, default=6, help="passes over this rank's shard (default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=32, help="samples per local step (default: %(default)s)")
    ap.add_argument("--lr", type=float, default=0.1, help="SGD learning rate, momentum 0.9 (default: %(default)s)")
    ap.add_argument("--samples", type=int, default=12000, help="MNIST-1D samples generated, 80%% for training (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="the model's initialisation and the shards (default: %(default)s)")
    ap.add_argument("--dirichlet", type=float, default=None, metavar="ALPHA",
                    help="non-i.i.d. shards: each rank's class mix drawn from Dirichlet(ALPHA), seeded by --seed "
                         "(0.1: strongly skewed, 100: near i.i.d.; default: i.i.d. shards)")
    ap.add_argument("--eval-every", type=int, default=0, metavar="STEPS",
                    help="test accuracy every STEPS local steps (default: after each epoch)")
    ap.add_argument("--json", metavar="FILE", help="the root of the final average writes the results here")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p2plearn.add_arguments(ap)
    add_model_arguments(ap)
    return ap.parse_args(argv)


def settings(options: Options) -> str:
    """The run's header: its settings, a staleness only where one applies (SSP)."""
    sync = f"sync={options.sync}" + (f" staleness={options.staleness}" if options.sync == "ssp" else "")
    return (f"{sync} selection={options.selection} p={options.fanout} tolerance={options.tolerance} "
            f"loss_bound={options.loss_bound} period={options.period} overlap={options.overlap} "
            f"outer_lr={options.outer_lr} outer_momentum={options.outer_momentum}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    options = Options.from_args(args)
    rt = p2plearn.init(**{f.name: getattr(options, f.name) for f in dataclasses.fields(options)})
    torch.manual_seed(args.seed)  # every peer starts from the same model
    model = make_model(args)
    data = mnist1d(args.samples)
    opt = p2plearn.DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9), model, rt,
                                          seed=args.seed)
    tag = f"rank {rt.rank}"
    if rt.rank == 0:
        print(f"{rt.world_size} peers, {settings(opt.options)}; {sum(p.numel() for p in model.parameters())} "
              f"parameters", flush=True)
    meter = UplinkMeter(opt.channel)  # the JSON's peak_uplink_bytes_per_s: this rank's, per 1 s window
    start = time.monotonic()
    history: list[tuple[float, float]] = []  # (wall s, this peer's test accuracy), for time-to-accuracy
    steps = 0
    for epoch in range(args.epochs):
        losses = []
        for x, y in shard(data, args.batch_size, rank=rt.rank, world_size=rt.world_size, epoch=epoch,
                          seed=args.seed, dirichlet=args.dirichlet):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step(loss=loss)
            opt.zero_grad()
            losses.append(float(loss.detach()))
            steps += 1
            if args.eval_every and steps % args.eval_every == 0:
                history.append((time.monotonic() - start, accuracy(model, data.x_test, data.y_test)))
        acc = accuracy(model, data.x_test, data.y_test)
        opt.report_accuracy(acc)
        if not args.eval_every:
            history.append((time.monotonic() - start, acc))
        print(f"{tag} epoch {epoch + 1}/{args.epochs}: train loss {sum(losses) / len(losses):.3f}, "
              f"test accuracy {acc:.3f}, {time.monotonic() - start:.1f} s", flush=True)
    opt.flush()  # the last overlapped round, if any, is part of the training
    wall = time.monotonic() - start
    peak_uplink = meter.stop()
    st = opt.stats()
    own = accuracy(model, data.x_test, data.y_test)
    print(f"{tag} done: own model test accuracy {own:.3f}; {st.rounds} rounds, average p {st.average_p:.2f}, "
          f"delivered {st.delivered:.3f}, communication {st.comm_s:.1f} s vs computation {st.compute_s:.1f} s, "
          f"sent {st.bytes_sent / 1e6:.1f} MB", flush=True)
    averaged = opt.average_model(root=0)
    if averaged is not None:
        model.load_state_dict(averaged, strict=False)
        avg = accuracy(model, data.x_test, data.y_test)
        print(f"averaged model test accuracy {avg:.3f} after {wall:.1f} s ({args.epochs} epochs, "
              f"{len(opt.averaged_from)} of {rt.world_size} peers' models, average p {st.average_p:.2f})", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"averaged_accuracy": avg, "own_accuracy": own, "wall_s": wall,
                           "steps": steps, "rounds": st.rounds, "average_p": st.average_p, "delivered": st.delivered,
                           "comm_s": st.comm_s, "compute_s": st.compute_s, "bytes_sent": st.bytes_sent,
                           "history": history, "round_times": st.round_times,
                           "send_times": st.send_times,
                           "retransmitted": st.retransmitted, "peak_uplink_bytes_per_s": peak_uplink}, f)
    opt.close()


if __name__ == "__main__":
    main()
