"""Claim: loss-tolerant rounds (Early Close within a loss bound) cut the round-latency tail under
incast and microbursts, against TCP (TcpChannel) and gloo all_reduce moving the same model size.

    sudo python experiments/loss_tolerance_vs_tcp.py [--quick] [--seeds N] [--out DIR]

Runs on the testbed (root: network namespaces, tbf-shaped veths, shallow switch queues, the
topology's scheduled bursts): the claim is about the kernel's queues, so it is not emulated; when
not root it writes a note and exits. A round is a synthetic model-sized exchange
(experiments/exchange_peer.py): each peer sends M bytes to p receivers drawn by a seeded random plan
(the same for every transport), then waits for its own send and for every message addressed to it
(a barrier). gloo instead all-reduces M bytes (ring: ~2M(n-1)/n sent per peer).
Full: incast-8 (1 Gbit/s, 48 KB queues, M = 4 MB) and microburst-8 (100 Mbit/s, M = 1 MB), p = 3,
50 rounds, engine bounds 0 / 0.01 / 0.05 / adaptive, TcpChannel, gloo; 3 seeds (~30 min).
Quick: 4-peer versions of both, 10 rounds, bounds 0 / 0.05, tcp, gloo, 1 seed (~1.5 min).
"""
from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common as c

NAME = "loss_tolerance_vs_tcp"


def transports(quick: bool) -> list[tuple[str, str]]:
    bounds = ["0", "0.05"] if quick else ["0", "0.01", "0.05", "adaptive"]
    return [("engine", b) for b in bounds] + [("tcp", "-"), ("gloo", "-")]


def run_config(tb, kind: str, bound: str, cfg: dict, tmp: Path) -> list[float] | None:
    """Every peer of the testbed runs one exchange; rank 0's latencies are the round latencies (the
    barrier makes every peer's rounds end together, within a message's delivery)."""
    n = len(tb.peers)
    cfg = {**cfg, "bound": bound if kind == "engine" else "0", "addresses": [tb.address(i) for i in range(n)], "start_at": time.time() + 4}
    procs, outs = [], [tmp / f"{kind}-{bound}-{cfg['seed']}-{i}.json" for i in range(n)]
    for i in range(n):
        procs.append(tb.run(i, [c.PY, str(c.ROOT / "experiments" / "exchange_peer.py"), kind, str(i), json.dumps(cfg),
                                str(outs[i])], env={"GLOO_SOCKET_IFNAME": tb.interface(i), "OMP_NUM_THREADS": "1"},
                            stderr=subprocess.PIPE))
    failed = False
    for i, proc in enumerate(procs):
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode:
            print(f"  rank {i} failed: {err.decode()[-800:]}", file=sys.stderr)
            failed = True
    return None if failed else json.loads(outs[0].read_text())["latencies"]


def latency_row(tb, kind: str, bound, cfg: dict, n: int, tmp: Path) -> c.Row | None:
    """One run's round latencies (p50, p99, max) and offered throughput per peer; None if it failed."""
    lat = run_config(tb, kind, bound, cfg, tmp)
    if not lat:
        return None
    sent = cfg["bytes"] * 2 * (n - 1) / n if kind == "gloo" else cfg["bytes"] * cfg["fanout"]
    return {"p50_s": c.percentile(lat, 0.5), "p99_s": c.percentile(lat, 0.99), "max_s": max(lat),
            "mbit_per_peer": sent * 8 / statistics.mean(lat) / 1e6, "latencies": lat}


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv)
    if not c.is_root():
        msg = "skipped: needs root (network namespaces); the claim is about the kernel's queues, not emulated"
        print(msg, file=sys.stderr)
        (args.out / f"{NAME}.md").write_text(f"# Loss tolerance vs TCP\n\n{msg}\n")
        return
    from p2plearn.testbed import Testbed
    from p2plearn.topology import incast, microburst

    n = 4 if args.quick else 8
    rounds = 10 if args.quick else 50
    setups = [("incast", incast(n), 1 << 20 if args.quick else 4 << 20, 125e6),
              ("microburst", microburst(n), 1 << 20, 12.5e6)]
    rows: list[c.Row] = []
    ports = itertools.count(47301)  # a fresh port per run: no TIME_WAIT clash for TCP and gloo
    with tempfile.TemporaryDirectory(prefix="p2pexp-") as tmp:
        for topo_name, topo, size, rate in setups:
            with Testbed(topo, name="exp") as tb:
                for kind, bound in transports(args.quick):
                    config = {"topology": f"{topo_name}-{n}", "transport": kind, "bound": bound, "megabytes": size / 2**20}

                    def one(seed: int) -> c.Row | None:  # called at once by repeat: the loop's values hold
                        cfg = {"bytes": size, "fanout": 3, "rounds": rounds, "rate": rate, "seed": seed, "port": next(ports)}
                        return latency_row(tb, kind, bound, cfg, n, Path(tmp))
                    rows += c.repeat(config, args.seeds, one)
    keys = ["topology", "transport", "bound"]
    metrics = {m: c.metric(m) for m in ("p50_s", "p99_s", "max_s", "mbit_per_peer")}
    tables = "\n\n".join(f"### {t}\n\n" + c.table([r for r in rows if r["topology"] == t], keys, metrics,
                                                   baseline=(t, "tcp", "-"), ratio_of="p99_s")
                         for t in dict.fromkeys(r["topology"] for r in rows))
    setup = (f"Testbed (root; network namespaces, tbf-shaped veths, the topology's switch queues and scheduled "
             f"bursts), {n} peers, p = 3 random receivers per round (same seeded plan for every transport), "
             f"{rounds} rounds per run, {args.seeds} seed(s). Round latency = rank 0's time from its send to the "
             f"end of the barrier (its send done, every message to it arrived or closed). gloo all-reduces the "
             f"same M bytes. Throughput = bytes each peer offers per round (M x p; gloo 2M(n-1)/n) / mean round "
             f"latency. Last column: p99 / TcpChannel's p99 on the same topology. " + c.load_note(rows))

    def draw(ax) -> None:
        for key, rs in c.groups(rows, keys).items():
            lat = sorted(x for r in rs if r["ok"] for x in r["latencies"])
            if lat:
                ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=" ".join(key))
        ax.set_xscale("log")
        ax.set_xlabel("round latency (s, log scale)")
        ax.set_ylabel("fraction of rounds (CDF)")
        ax.set_title("Round latency on the testbed, all seeds", fontsize=10)
        ax.legend(fontsize=7)

    c.write_results(args.out, NAME, rows, "Loss tolerance vs TCP and gloo: round latency", setup, tables, draw)


if __name__ == "__main__":
    sys.exit(main())
