"""Claim (issue 43): a round costs what gloo's costs: a full average of GPT-2 small and of 10 MiB on
loopback, and a DDP step over the backend and its hook, each against gloo in the same run.

    python experiments/round_cpu.py [--quick] [--seeds N] [--out DIR]

Runs `python -m p2plearn.bench average` (4 peers on loopback, --sync partitioned, uncompressed and
with the default `--compress int4`, against gloo's float32 all_reduce of DDP's 25 MiB buckets; GPT-2 small's 148 tensors, 498 MB, 5 rounds, and one
10 MiB tensor, 20 rounds) and `python -m p2plearn.bench ddp` (4 ranks, a 4.2M-parameter MLP, 30
steps: DDP's all-reduce over p2plearn, the loss-tolerant hook at a fixed 5% bound, the same with
its Hadamard transform) --seeds times each; every row is a ratio to gloo's figure of the same run.
Run it alone: the 4 ranks share the machine's 2 cores, and everything else running there weighs
on p2plearn's and gloo's times alike but not equally. Quick: 10 MiB and DDP only, one seed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import common as c

NAME = "round_cpu"
AVERAGES = {"gpt2-small": ["--model", "gpt2-small", "--rounds", "5"], "10 MiB": ["--megabytes", "10", "--rounds", "20"]}


def bench(argv: list[str]) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "p2plearn.bench", *argv, "--json"], cwd=c.ROOT, capture_output=True,
                         text=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode:
        raise RuntimeError(f"bench {' '.join(argv)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout[out.stdout.index("["):])


def finished() -> dict:
    """When a row's run ended and the machine's load then (what `common.load_note` reports)."""
    return {"finished_utc": time.strftime("%H:%M:%S", time.gmtime()), "load_1min": os.getloadavg()[0]}


def run(seed: int, quick: bool) -> list[c.Row]:
    rows: list[c.Row] = []
    for model, args in AVERAGES.items():
        if quick and model == "gpt2-small":
            continue
        measured = bench(["average", "--topologies", "loopback", "--modes", "partitioned,partitioned int4",
                          "--gloo-dtypes", "float32", *args])
        gloo = next(r for r in measured if r["system"].startswith("gloo"))
        for r in measured:
            rows.append({"benchmark": f"average {model}", "system": r["system"], "seed": seed,
                         "time_s": r["round_s"], "x_time": r["round_s"] / gloo["round_s"],
                         "cpu_s": r["cpu_s_per_100mb"], "x_cpu": r["cpu_s_per_100mb"] / gloo["cpu_s_per_100mb"],
                         "peak_rss_mb": r["peak_rss_mb"], "x_rss": r["peak_rss_mb"] / gloo["peak_rss_mb"],
                         **finished()})
    measured = bench(["ddp", "--steps", "30"])
    gloo = next(r for r in measured if r["config"] == "gloo")
    for r in measured:
        rows.append({"benchmark": "ddp step", "system": r["config"], "seed": seed, "time_s": r["step_s"],
                     "x_time": r["step_s"] / gloo["step_s"], "cpu_s": r["cpu_s"], "x_cpu": r["cpu_s"] / gloo["cpu_s"],
                     **finished()})
    return rows


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv)
    rows = [row for seed in range(args.seeds) for row in run(seed, args.quick)]
    metrics = {"time s (average: round; ddp: step)": c.metric("time_s"), "x gloo": c.metric("x_time"),
               "CPU s (average: per round per 100 MB; ddp: per step, all ranks)": c.metric("cpu_s"),
               "x gloo CPU": c.metric("x_cpu"), "peak RSS MB": c.metric("peak_rss_mb"), "x gloo RSS": c.metric("x_rss")}
    setup = (f"4 peers (ranks) on this machine's loopback, {args.seeds} run(s) of each benchmark; cells: median "
             f"[min-max] over runs. {c.load_note(rows)} Average: one full average of the model per round, "
             "`--sync partitioned` (float32, and int4: the default `--compress`) against gloo float32's all_reduce of DDP's 25 MiB buckets (medians over the "
             "rounds after the first 2; CPU: all ranks' processes, launcher and coordinator not counted). DDP: "
             "a training step of a 4.2M-parameter MLP (4 layers of 1024), batch 32, over gloo, over the p2plearn "
             "backend (DDP's all-reduce), with `loss_tolerant_hook` (fixed 5%), and with the hook's Hadamard "
             "transform.")
    tables = c.table(rows, ["benchmark", "system"], metrics)
    c.write_results(args.out, NAME, rows, "A round's cost against gloo's: full averages and DDP steps", setup, tables,
                    lambda ax: c.bar_chart(ax, [r for r in rows if r["system"] != "gloo" and
                                                not r["system"].startswith("gloo")], ["benchmark", "system"],
                                           c.metric("x_cpu"), "CPU x gloo's", "CPU against gloo in the same run"))


if __name__ == "__main__":
    main()
