"""Claim: p2plearn (best settings: SSP s=2, selmcast p=1, adaptive tolerance, value filter) reaches a
target accuracy sooner in wall time than torch DDP (gloo all_reduce every step) on the same network and data.

    sudo python experiments/time_to_accuracy.py [--quick] [--seeds N] [--out DIR]

As root both run on the testbed (homogeneous-4: 4 namespaces at 100 Mbit/s; DDP with
GLOO_SOCKET_IFNAME and MASTER_ADDR = rank 0's testbed address). Not root: p2plearn `--emulate`
against DDP on loopback (unshaped: favours DDP), said in the table. Same model (MNIST-1D MLP, 2 hidden layers
of 1536, 2.4M parameters, 9.7 MB), same samples and shards per rank, same optimizer; at 100 Mbit/s
one exchange of the whole model costs far more than a step's compute, so communication matters.
Full: 6 epochs, 12000 samples, 3 seeds (~12 min). Quick: 2 epochs, 4000 samples, 1 seed (~1.5 min).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import common as c

NAME = "time_to_accuracy"
HIDDEN = 1536  # MLP: 2.4M parameters, 9.7 MB: at 100 Mbit/s an exchange costs ~100x the step's compute
BATCH = 128
TOPOLOGY = "topology/homogeneous-4.json"
BEST = {"sync": "ssp", "staleness": 2, "selection": "selmcast", "fanout": 1, "tolerance": "adaptive",
        "filter": "value"}


def mlp_size() -> int:
    from p2plearn.examples.mnist1d import MLP

    return sum(p.numel() for p in MLP(HIDDEN).parameters())


def ddp(n: int, script: dict, testbed: bool, port: int) -> c.Row | None:
    """Run experiments/ddp_mnist1d.py on n ranks (in the testbed's namespaces when asked)."""
    with tempfile.TemporaryDirectory(prefix="p2pexp-") as tmp:
        out = Path(tmp) / "ddp.json"
        argv = [c.PY, str(c.ROOT / "experiments" / "ddp_mnist1d.py"), *c.args_of(script), "--json", str(out)]
        env = {"WORLD_SIZE": str(n), "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        if not testbed:
            procs = [subprocess.Popen(argv, cwd=c.ROOT, env={**os.environ, **env, "RANK": str(i),
                                                              "MASTER_ADDR": "127.0.0.1"}) for i in range(n)]
            codes = [p.wait(timeout=900) for p in procs]
            return json.loads(out.read_text()) if not any(codes) and out.exists() else None
        from p2plearn.testbed import Testbed

        with Testbed(c.ROOT / TOPOLOGY, name="expddp") as tb:
            procs = [tb.run(i, argv, env={**env, "RANK": str(i), "MASTER_ADDR": tb.address(0),
                                          "GLOO_SOCKET_IFNAME": tb.interface(i)}, cwd=c.ROOT) for i in range(n)]
            codes = [p.wait(timeout=900) for p in procs]
        return json.loads(out.read_text()) if not any(codes) and out.exists() else None


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv)
    testbed = c.is_root()
    script = {"model": "mlp", "hidden": HIDDEN, "batch_size": BATCH, "epochs": 2 if args.quick else 6,
              "samples": 4000 if args.quick else 12000}
    target = 0.25 if args.quick else 0.5
    rows = []
    rows += c.repeat({"system": "p2plearn", "settings": "ssp s=2, selmcast p=1, adaptive, value filter"}, args.seeds,
                     lambda seed: c.train(4, BEST, {**script, "seed": seed}, topology=TOPOLOGY, testbed=testbed))
    rows += c.repeat({"system": "ddp", "settings": "gloo all_reduce per step"}, args.seeds,
                     lambda seed: ddp(4, {**script, "seed": seed}, testbed, 29500 + seed))
    for r in rows:
        if r["ok"]:
            r["tta_s"] = c.time_to_accuracy(r["history"], target)
            r["mb_sent"] = r["bytes_sent"] / 1e6
    where = ("Testbed (root; 4 network namespaces shaped to 100 Mbit/s by tbf; both systems)" if testbed else
             "Fallback (not root): p2plearn `--emulate` (paced to 100 Mbit/s) vs DDP on unshaped loopback")
    setup = (f"{where}; `{TOPOLOGY}`, MNIST-1D MLP (2 hidden layers of {HIDDEN}, "
             f"{mlp_size() / 1e6:.1f}M parameters), {script['epochs']} epochs, {script['samples']} samples, "
             f"batch {BATCH} per rank, SGD lr 0.1 momentum 0.9, {args.seeds} seed(s); "
             f"median [min-max]. p2plearn accuracy: rank 0's own model per epoch (final: the averaged model); "
             f"DDP: the (identical) model of rank 0. MB sent: rank 0 (DDP: ring all_reduce estimate). "
             f"Ratio: time to {target:.0%} / DDP's.")
    keys = ["system", "settings"]
    metrics = {f"time to {target:.0%} s": c.metric("tta_s"), "final accuracy": c.metric("averaged_accuracy"),
               "wall s": c.metric("wall_s"), "MB sent": c.metric("mb_sent")}
    tables = c.table(rows, keys, metrics, baseline=("ddp", "gloo all_reduce per step"),
                     ratio_of=f"time to {target:.0%} s")
    c.write_results(args.out, NAME, rows, "Time to accuracy: p2plearn vs DDP", setup, tables,
                    lambda ax: c.accuracy_curves(ax, rows, ["system"], "Test accuracy over wall time, seed 0"))


if __name__ == "__main__":
    sys.exit(main())
