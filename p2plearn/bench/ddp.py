"""A DDP training step over the p2plearn backend against the same step over gloo, in one run.

    python -m p2plearn.bench ddp [--ranks 4] [--hidden 1024] [--layers 4] [--steps 40]
                                 [--configs gloo,p2plearn,hook,hook-hadamard] [--json]
                                 [--profile [--profile-seconds 5] [--profile-dir DIR]]

Each configuration starts --ranks processes on loopback (one thread each, as torchrun would with
OMP_NUM_THREADS=1), wraps the same MLP (--layers linear layers of --hidden units: hidden^2 x layers
parameters) in ``DistributedDataParallel`` and times --steps steps of random batches (forward,
backward with DDP's bucket all-reduces, SGD step), after 5 unmeasured ones. Configurations: ``gloo``
(the baseline); ``p2plearn`` (``init_process_group("p2plearn")``, DDP's own all-reduce); ``hook``
(p2plearn's `loss_tolerant_hook`, fixed 5% bound); ``hook-hadamard`` (the same with its randomized
Hadamard transform). The table gives each one's median step time and all ranks' CPU seconds per
step, each as a ratio to gloo's of the same run. Run it alone on a quiet machine: the ranks share
the machine's cores with each other, and with anything else running. --profile: each configuration's
ranks are also recorded with perf for --profile-seconds of the steps after the warm-up (bench.profile),
and a second table gives each phase's share of their CPU (compute in torch, merge, tags, copies...).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from p2plearn.bench import profile

CONFIGS = ("gloo", "p2plearn", "hook", "hook-hadamard")
WARM = 5  # steps that include DDP's first-iteration set-up and the first plans


def rank_main(out: str, config: str, hidden: int, layers: int, steps: int) -> None:
    """One rank: WARM + `steps` DDP steps; writes its step times and CPU seconds per step."""
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo" if config == "gloo" else "p2plearn")
    model = torch.nn.Sequential(*[torch.nn.Linear(hidden, hidden) for _ in range(layers)])
    ddp = DistributedDataParallel(model)
    if config.startswith("hook"):
        import p2plearn.ddp

        state = p2plearn.ddp.LossTolerantState("fixed", model=model, loss_bound=0.05, hadamard=config == "hook-hadamard")
        ddp.register_comm_hook(state, p2plearn.ddp.loss_tolerant_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x, y = torch.randn(32, hidden), torch.randn(32, hidden)
    times, cpu = [], []
    for step in range(WARM + steps):
        t0, c0 = time.monotonic(), time.process_time()
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if step >= WARM:
            times.append(time.monotonic() - t0)
            cpu.append(time.process_time() - c0)
        profile.mark_steady(step + 1)
    Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps({"step_s": times, "cpu_s": cpu}))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_config(config: str, ranks: int, hidden: int, layers: int, steps: int, extra_env: dict[str, str]) -> dict:
    """Median step time (rank 0's) and all ranks' CPU seconds per step (median over steps)."""
    with tempfile.TemporaryDirectory(prefix="p2pbench-ddp-") as out:
        env = {**os.environ, **extra_env, "WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
               "OMP_NUM_THREADS": "1", "LOCAL_WORLD_SIZE": str(ranks)}
        argv = [sys.executable, "-m", "p2plearn.bench.ddp", "--rank", out, config, str(hidden), str(layers), str(steps)]
        procs = [subprocess.Popen(argv, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(ranks)]
        try:
            codes = [p.wait(timeout=900) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(codes):
            raise RuntimeError(f"ddp {config}: a rank failed (exit codes {codes})")
        results = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(ranks)]
    cpu_per_step = [sum(r["cpu_s"][i] for r in results) for i in range(steps)]
    return {"config": config, "step_s": statistics.median(results[0]["step_s"]),
            "cpu_s": statistics.median(cpu_per_step)}


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--rank":
        return rank_main(argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5]))
    ap = argparse.ArgumentParser(prog="python -m p2plearn.bench ddp", description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4, help="processes, one per rank (default: %(default)s)")
    ap.add_argument("--hidden", type=int, default=1024, help="units per layer (default: %(default)s)")
    ap.add_argument("--layers", type=int, default=4, help="linear layers (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=40, help="measured steps per configuration (default: %(default)s)")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma-separated, gloo (the baseline) among them (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON instead of a table")
    profile.add_arguments(ap)
    args = ap.parse_args(argv)
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or "gloo" not in configs:
        ap.error(f"--configs: {', '.join(unknown) or 'gloo (the baseline) is missing'}; choose of {', '.join(CONFIGS)}")
    profiling = profile.wanted(args)
    rows, profiles = [], []
    for config in configs:
        prof = profile.Profile(args.ranks, WARM, args.profile_seconds, args.profile_dir, name=f"ddp-{config}") \
            if profiling else None
        with prof or contextlib.nullcontext():
            rows.append(run_config(config, args.ranks, args.hidden, args.layers, args.steps, prof.env if prof else {}))
        if prof:
            rows[-1].update(profile=prof.shares, profile_note=prof.note)
        profiles.append((config, prof))
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    base = next(r for r in rows if r["config"] == "gloo")
    params = args.hidden * (args.hidden + 1) * args.layers
    print(f"DDP step, {args.ranks} ranks on loopback, MLP of {params / 1e6:.1f}M parameters, {args.steps} steps "
          f"after {WARM}; load average {os.getloadavg()[0]:.1f} at the end on {os.cpu_count()} cores\n")
    print("| configuration | step ms | x gloo | CPU s / step (all ranks) | x gloo |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {1e3 * r['step_s']:.1f} | {r['step_s'] / base['step_s']:.2f} | {r['cpu_s']:.3f} | "
              f"{r['cpu_s'] / base['cpu_s']:.2f} |")
    if profiling:
        profile.print_table(profiles, f"the {args.ranks} ranks' processes")


if __name__ == "__main__":
    main(sys.argv[1:])
