"""Decentralized training of a byte-level decoder-only transformer language model on the Python
standard library's own source files (offline on every machine), one process per peer.

    p2plearn-run -np 4 -- python -m p2plearn.examples.charlm
    p2plearn-run -np 4 --topology topology/heterogeneous-4.json --emulate -- \\
        python -m p2plearn.examples.charlm --sync partitioned --period 16 --checkpoint ckpt
    torchrun --nproc-per-node 4 -m p2plearn.examples.charlm --steps 300

Each peer trains on its shard of the corpus (``p2plearn.data.stdlib_text``: windows of --context
bytes, held-out validation bytes at the end) with AdamW, and averages with its peers as the
options say. Rank 0 prints train loss and perplexity every --log-every steps and validation loss
and perplexity every --eval-every; at the end every peer reports its own validation loss, and the
root of the final average (rank 0) the validation loss of the averaged model.

Tuning: the default (4 layers, dim 192, 4 heads, context 64, batch 8: 1.9M parameters, 7.6 MB a
message) takes ~0.15 s a step on a free CPU core, so 4 ranks train its 300 steps in minutes. --layers 12 --dim 768 --heads 12
--context 1024 is GPT-2 small's body (86M parameters without GPT-2's 50257-token vocabulary);
--dim 1024 --layers 16 ~200M: give those --device cuda (p2plearn averages the device model
through host buffers: docs/memory.md says what that costs). --lr 1e-3 suits the default
size; larger models want less (3e-4 at 100M+). --checkpoint DIR saves every rank's state every
--eval-every steps and resumes from DIR's newest complete step when started again.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

import p2plearn
from p2plearn.transport.uplink import UplinkMeter
from p2plearn.options import Options
from p2plearn.train.data import Dataset, shard, stdlib_text


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x GELU MLP."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(dim, dim=2)
        q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, dim))
        return x + self.mlp(self.ln2(x))


class CharLM(nn.Module):
    """Decoder-only transformer over bytes: ~12 dim^2 parameters per layer, plus 256 x dim for the
    byte embedding and the head and context x dim for the learned positions."""

    def __init__(self, layers: int = 4, dim: int = 192, heads: int = 4, context: int = 64, vocab: int = 256):
        super().__init__()
        if dim % heads:
            raise ValueError(f"--dim {dim} is not a multiple of --heads {heads}")
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.head(self.ln(self.blocks(self.embed(tokens) + self.position(positions))))


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in nats per byte of predicting y (the next bytes) from x."""
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def validation_loss(model: nn.Module, data: Dataset, windows: int, device: str, batch_size: int = 32) -> float:
    """Mean loss over the first `windows` held-out windows (evaluation mode, no gradients)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, min(windows, len(data.y_test)), batch_size):
            x, y = data.x_test[i:i + batch_size][:windows - i], data.y_test[i:i + batch_size][:windows - i]
            total += float(lm_loss(model, x.to(device), y.to(device))) * len(y)
            count += len(y)
    model.train(was_training)
    return total / count


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags shared with torch's baseline (experiments/torch_charlm.py): model, data, optimizer."""
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks (default: %(default)s)")
    ap.add_argument("--dim", type=int, default=192, help="model width; parameters grow as 12 dim^2 per layer "
                                                         "(default: %(default)s)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads, dividing --dim (default: %(default)s)")
    ap.add_argument("--context", type=int, default=64, help="bytes per training window (default: %(default)s)")
    ap.add_argument("--corpus-mb", type=float, default=8.0,
                    help="MB of standard-library source read, 5%% held out for validation (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=300, help="local steps per rank (default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=8, help="windows per local step (default: %(default)s)")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate, weight decay 0.01 "
                                                           "(default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="the model's initialisation and the shards (default: %(default)s)")
    ap.add_argument("--device", default="cpu", help="where the model trains: cpu, cuda, cuda:1 ... (default: %(default)s)")
    ap.add_argument("--eval-every", type=int, default=50, metavar="STEPS",
                    help="validation loss every STEPS local steps (default: %(default)s)")
    ap.add_argument("--eval-windows", type=int, default=64,
                    help="held-out windows each validation uses (default: %(default)s)")
    ap.add_argument("--log-every", type=int, default=10, metavar="STEPS",
                    help="rank 0 prints its train loss every STEPS (default: %(default)s)")
    ap.add_argument("--json", metavar="FILE", help="the root of the final average writes the results here")


def make_model(args: argparse.Namespace) -> CharLM:
    """The model the flags name, initialised from --seed (the same on every rank)."""
    torch.manual_seed(args.seed)
    return CharLM(args.layers, args.dim, args.heads, args.context).to(args.device)


def make_optimizer(args: argparse.Namespace, model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)


def train(args: argparse.Namespace, model: nn.Module, data: Dataset, rank: int, world_size: int,
          step: Callable[[torch.Tensor], None], first_step: int = 0,
          on_eval: Callable[[int], None] | None = None) -> list[tuple[float, float]]:
    """The torch loop both p2plearn and the torch baseline run: --steps local steps from `first_step`
    over this rank's shard, `step(loss)` after each backward (the optimizer's step and zero_grad),
    validation every --eval-every steps. Returns (wall s, validation loss) of each evaluation."""
    batches_per_epoch = (len(data) // world_size) // args.batch_size
    if batches_per_epoch == 0:
        raise ValueError(f"--corpus-mb {args.corpus_mb:g} gives each of {world_size} ranks fewer windows than "
                         f"--batch-size {args.batch_size}")
    start, history, done, recent = time.monotonic(), [], first_step, []
    while done < args.steps:
        epoch, skip = divmod(done, batches_per_epoch)  # resuming mid-epoch skips the batches already trained
        for i, (x, y) in enumerate(shard(data, args.batch_size, rank=rank, world_size=world_size, epoch=epoch,
                                         seed=args.seed)):
            if i < skip:
                continue
            loss = lm_loss(model, x.to(args.device), y.to(args.device))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            step(loss)
            done += 1
            recent.append(float(loss.detach()))
            if rank == 0 and done % args.log_every == 0:
                mean = sum(recent) / len(recent)
                print(f"step {done}: train loss {mean:.3f}, perplexity {math.exp(mean):.2f}, "
                      f"{time.monotonic() - start:.1f} s", flush=True)
                recent.clear()
            if done % args.eval_every == 0 or done == args.steps:
                history.append((time.monotonic() - start, validation_loss(model, data, args.eval_windows, args.device)))
                if rank == 0:
                    print(f"step {done}: validation loss {history[-1][1]:.3f}, perplexity "
                          f"{math.exp(history[-1][1]):.2f}", flush=True)
                if on_eval:
                    on_eval(done)
            if done == args.steps:
                break
    return history


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p2plearn.add_arguments(ap)
    add_model_arguments(ap)
    ap.add_argument("--checkpoint", metavar="DIR", help="save every --eval-every steps; resume from DIR's newest "
                                                        "complete step")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    options = Options.from_args(args)
    rt = p2plearn.init(**{f.name: getattr(options, f.name) for f in dataclasses.fields(options)})
    model = make_model(args)
    data = stdlib_text(args.context, int(args.corpus_mb * 1e6))
    opt = p2plearn.DecentralizedOptimizer(make_optimizer(args, model), model, rt, seed=args.seed)
    if args.checkpoint:
        p2plearn.checkpoint.load(args.checkpoint, model, opt)
    if rt.rank == 0:
        print(f"{rt.world_size} peers, sync={opt.options.sync} period={opt.options.period} "
              f"selection={opt.options.selection} compress={opt.options.compress}; "
              f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters; corpus "
              f"{len(data) * args.context / 1e6:.1f} MB train, {len(data.y_test) * args.context / 1e6:.2f} MB "
              f"validation", flush=True)

    def step(loss: torch.Tensor) -> None:
        opt.step(loss=loss)
        opt.zero_grad()

    def save(_: int) -> None:
        if args.checkpoint:
            p2plearn.checkpoint.save(args.checkpoint, model, opt)

    meter = UplinkMeter(opt.channel)  # the JSON's peak_uplink_bytes_per_s: this rank's, per 1 s window
    history = train(args, model, data, rt.rank, rt.world_size, step, first_step=opt.steps, on_eval=save)
    opt.flush()  # the last overlapped round, if any, is part of the training
    peak_uplink = meter.stop()
    st = opt.stats()
    own = validation_loss(model, data, args.eval_windows, args.device)
    print(f"rank {rt.rank} done: own model validation loss {own:.3f} (perplexity {math.exp(own):.2f}); "
          f"{st.rounds} rounds, communication {st.comm_s:.1f} s vs computation {st.compute_s:.1f} s, "
          f"sent {st.bytes_sent / 1e6:.1f} MB", flush=True)
    averaged = opt.average_model(root=0)
    if averaged is not None:
        model.load_state_dict(averaged, strict=False)
        avg = validation_loss(model, data, args.eval_windows, args.device)
        print(f"averaged model validation loss {avg:.3f} (perplexity {math.exp(avg):.2f}) from "
              f"{len(opt.averaged_from)} of {rt.world_size} peers", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"averaged_loss": avg, "own_loss": own, "wall_s": history[-1][0] if history else 0.0,
                           "steps": opt.steps, "rounds": st.rounds, "comm_s": st.comm_s, "compute_s": st.compute_s,
                           "bytes_sent": st.bytes_sent, "history": history, "round_times": st.round_times,
                           "peak_uplink_bytes_per_s": peak_uplink}, f)
    opt.close()


if __name__ == "__main__":
    main()
