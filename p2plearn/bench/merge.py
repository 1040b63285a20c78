"""The robust merge's CPU against the plain merge's, per byte of what is merged.

    python -m p2plearn.bench merge [--megabytes 16] [--senders 4] [--repeats 7] [--json]

One float32 tensor of --megabytes MiB, merged in place with --senders contributions, each way:
the plain merge (`sync.merge`), ``--robust clip`` and ``--robust trimmed`` (`sync.robust`), with
float32 values complete, float32 values with 10% of chunks lost, and int8 values (a scale per 256).
Each cell is the median over --repeats merges of the process's CPU time (one thread: the merges are
single-threaded C) per byte of the contributions' values, and the robust merges' ratio to the plain
one's. Target (issue 46): clip <= 1.3x the plain merge per byte.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from p2plearn.sync.merge import Contribution, merge_parameter
from p2plearn.sync.robust import RobustMerge
from p2plearn.transport.delivery import ChunkMask

CHUNK = 1400  # bytes per chunk: about a datagram's payload


def contributions(case: str, own: np.ndarray, senders: int, rng: np.random.Generator) -> list[Contribution]:
    """--senders contributions near `own` in the case's format."""
    out = []
    for _ in range(senders):
        v = (own + 0.01 * rng.standard_normal(own.size, dtype=np.float32)).astype(np.float32)
        if case == "int8":
            blocks = v.reshape(-1, 256)
            scales = np.abs(blocks).max(1) / 127
            q = np.rint(blocks / scales[:, None]).astype(np.int8).reshape(-1)
            out.append(Contribution(q, scales=scales.astype(np.float32), block=256, finite_only=True))
        elif case == "float32, 10% lost":
            arrived = rng.random(-(-v.nbytes // CHUNK)) > 0.1
            out.append(Contribution(v, chunks=ChunkMask(arrived, 0, CHUNK)))
        else:
            out.append(Contribution(v))
    return out


def cpu_per_byte(merges: dict, own: np.ndarray, nbytes: int, repeats: int) -> dict[str, float]:
    """Per merge, the median CPU ns of `merge(copy of own)` per byte merged over `repeats` runs; the
    merges take turns, so that a change in the machine's load weighs on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in merges}
    for _ in range(repeats):
        for name, merge in merges.items():
            target = own.copy()
            t0 = time.process_time()
            merge(target)
            times[name].append(time.process_time() - t0)
    return {name: statistics.median(ts) / nbytes * 1e9 for name, ts in times.items()}


def run(megabytes: float, senders: int, repeats: int) -> list[dict]:
    rng = np.random.default_rng(0)
    n = int(megabytes * 2**20 / 4) // 256 * 256
    own = rng.standard_normal(n, dtype=np.float32)
    rows = []
    for case in ("float32", "float32, 10% lost", "int8"):
        cs = contributions(case, own, senders, rng)
        robust = {mode: RobustMerge(mode) for mode in ("clip", "trimmed")}
        merges = {"plain": lambda t: merge_parameter(t, cs)}
        merges.update({mode: (lambda t, r=r: r.merge_parameter(0, t, cs, list(range(senders))))
                       for mode, r in robust.items()})
        ns = cpu_per_byte(merges, own, sum(c.values.nbytes for c in cs), repeats)
        row = {"case": case, "senders": senders, "megabytes": megabytes, "plain_ns_per_byte": ns["plain"]}
        for mode in robust:
            row[f"{mode}_ns_per_byte"] = ns[mode]
            row[f"{mode}_ratio"] = ns[mode] / ns["plain"]
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| values | plain ns/B | clip ns/B | clip / plain | trimmed ns/B | trimmed / plain |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['plain_ns_per_byte']:.3f} | {r['clip_ns_per_byte']:.3f} | "
                     f"{r['clip_ratio']:.2f}x | {r['trimmed_ns_per_byte']:.3f} | {r['trimmed_ratio']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m p2plearn.bench merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=16.0, help="the tensor's MiB, float32 (default: 16)")
    parser.add_argument("--senders", type=int, default=4, help="contributions merged at once (default: 4)")
    parser.add_argument("--repeats", type=int, default=7,
                        help="merges per cell, the median reported (default: 7)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    if args.megabytes <= 0 or args.senders < 1 or args.repeats < 1:
        parser.error("--megabytes must be > 0, --senders and --repeats >= 1")
    rows = run(args.megabytes, args.senders, args.repeats)
    print(json.dumps(rows, indent=1) if args.json else table(rows))
