"""The simulator against the testbed: the same rounds, simulated and measured (root only).

    python -m p2plearn.sim.validate [--out experiments/results] [--rounds 4]

`compare(topology, policy, p, message_bytes, rounds)` builds the topology as a Testbed, starts one
`p2plearn.sim.peer` per namespace, and runs `rounds` rounds: every peer sends its message to its
receivers of the round (the plan and pacing rates the simulator uses, computed by each peer), waits
for its sends and its expected inputs, and reports; the next round starts when every peer has
(a barrier kept by this process through the peers' pipes). A round's measured time runs from the
"go" to the last peer's report. Before them, CALIBRATION rounds of a 1 KB message measure the fixed
cost of a round on this host (handshakes, wake-ups of 8 processes on 2 cores): the simulator gets
the shortest as its latency_s (the host's other work only adds to a round, so a calibration taken
during a spike would make the simulator slower than any round it predicts). `host_rate(n)`
measures, once per process, how many bytes/s this host's CPUs move between n namespaces when every
peer sends to all others over links shaped far above that (the testbed's own ceiling: 8 peers at
1 Gbit/s may ask for 8 Gbit/s, near what a 2-core host carries), from its fastest rounds for the
same reason; the simulator gets it as its host_rate. The CLI writes sim_validation.csv/.md/.png
for CASES.
"""
from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from p2plearn.sim.simulator import WIRE_EFFICIENCY, Simulator
from p2plearn.testbed import Testbed
from p2plearn.topology import Topology, load, save
from p2plearn.topology.generators import homogeneous

PORT = 47300
CALIBRATION = 3          # rounds of TINY bytes before the measured ones
TINY = 1000
HOST_LINK_MBIT = 10_000  # links of the host-rate rounds: far above what 2 cores move in all
HOST_BYTES = 4_000_000   # message of the host-rate rounds: 224 MB per round for 8 peers, so the fixed cost is small
TOPOLOGY_DIR = Path(__file__).resolve().parents[2] / "topology"
# (topology, policy, p, message bytes): bandwidth dominates each (rounds of 0.1-1 s on 2 cores).
CASES = [("homogeneous-8", "random", 2, 2_000_000), ("homogeneous-8", "selmcast", 2, 2_000_000),
         ("heterogeneous-8", "random", 1, 1_000_000), ("heterogeneous-8", "selmcast", 1, 1_000_000),
         ("incast-8", "random", 2, 4_000_000), ("incast-8", "selmcast", 2, 4_000_000)]


@dataclass
class Comparison:
    """Median round time over the rounds, simulated and measured, and the relative error."""

    topology: str
    policy: str
    p: int
    message_bytes: int
    rounds: int
    simulated_s: float
    measured_s: float
    measured_rounds: list[float]
    latency_s: float
    host_rate: float
    resent: float               # retransmitted / sent datagrams over the measured rounds

    @property
    def error(self) -> float:
        return self.simulated_s / self.measured_s - 1.0


def simulate(topology: Topology, policy: str, p: int, message_bytes: int, rounds: int, seed: int = 0,
             latency_s: float = 0.0, host_rate: float | None = None) -> list[float]:
    """Per-round times the simulator predicts (no compute, exact delivery)."""
    sim = Simulator.from_topology(topology, message_bytes, policy=policy, p=p, seed=seed, latency_s=latency_s,
                                  host_rate=host_rate)
    return [r.time_s for r in sim.run(rounds).rounds]


@contextmanager
def testbed_peers(topology: Topology, policy: str, p: int, message_bytes: int, rounds: int,
                  seed: int = 0) -> Iterator[tuple[Testbed, list[subprocess.Popen]]]:
    """`topology` built as a Testbed (root) with one `p2plearn.sim.peer` per namespace, each ready
    for `rounds` rounds (see its docstring); every peer and namespace is gone on exit, also on failure."""
    with tempfile.TemporaryDirectory() as tmp, Testbed(topology) as tb:
        path = os.path.join(tmp, "topology.json")
        save(topology, path)
        hosts = ",".join(tb.address(i) for i in range(len(tb.peers)))
        secret = secrets.token_hex(32)  # tags on, as in training
        peers = [tb.run(i, [sys.executable, "-m", "p2plearn.sim.peer", path, str(i), hosts, str(PORT), policy,
                            str(p), str(message_bytes), str(rounds), str(seed)],
                        env={"OMP_NUM_THREADS": "1", "P2PLEARN_JOB_KEY": secret}, stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, text=True)
                 for i in range(len(tb.peers))]
        for i, peer in enumerate(peers):
            _expect(peer, i, "ready")
        yield tb, peers
        for peer in peers:
            peer.stdin.close()
            peer.wait(10)


def run_round(peers: list[subprocess.Popen], commands: list[str]) -> list[dict]:
    """One round: each peer's command line (see `p2plearn.sim.peer`), then every peer's report."""
    for peer, command in zip(peers, commands):
        peer.stdin.write(command + "\n")
        peer.stdin.flush()
    return [json.loads(_expect(peer, i, "{")) for i, peer in enumerate(peers)]


def measure(topology: Topology, policy: str, p: int, message_bytes: int, rounds: int,
            seed: int = 0) -> tuple[list[float], list[float], float]:
    """Wall times of the CALIBRATION tiny rounds and of the `rounds` rounds on the testbed (root), and
    the fraction of the measured rounds' datagrams that were retransmissions."""
    with testbed_peers(topology, policy, p, message_bytes, CALIBRATION + rounds, seed) as (_, peers):
        times, sent, resent = [], 0, 0
        # The tiny rounds use plans of other round numbers, so the measured rounds are 0..rounds-1.
        schedule = [(rounds + k, TINY) for k in range(CALIBRATION)] + [(r, message_bytes) for r in range(rounds)]
        for rnd, size in schedule:
            t0 = time.monotonic()
            reports = run_round(peers, [f"go {rnd} {size}"] * len(peers))
            if size == message_bytes:
                sent += sum(f["sent"] for r in reports for f in r["flows"])
                resent += sum(f["retransmitted"] for r in reports for f in r["flows"])
            times.append(time.monotonic() - t0)
        return times[:CALIBRATION], times[CALIBRATION:], resent / sent if sent else 0.0


@functools.cache
def host_rate(n: int) -> float:
    """Bytes/s (frames included) that this host moves between n namespaces, all flows together: all-to-all
    rounds of HOST_BYTES on HOST_LINK_MBIT links, less the fixed cost of a round (tiny rounds)."""
    tiny, rounds, _ = measure(homogeneous(n, HOST_LINK_MBIT), "all", n - 1, HOST_BYTES, 3)
    busy = min(rounds) - min(tiny)  # the host at its best: other work only slows a round
    return n * (n - 1) * HOST_BYTES / WIRE_EFFICIENCY / busy


def _expect(peer: subprocess.Popen, rank: int, start: str) -> str:
    line = peer.stdout.readline()
    if not line.startswith(start):
        raise RuntimeError(f"peer {rank} said {line!r} (exit code {peer.poll()}), expected {start!r}...")
    return line


def compare(topology: Topology | str, policy: str, p: int, message_bytes: int, rounds: int,
            seed: int = 0) -> Comparison:
    """Simulated against measured median round time for one setting."""
    topo = topology if isinstance(topology, Topology) else load(topology)
    tiny, measured, resent = measure(topo, policy, p, message_bytes, rounds, seed)
    latency = min(tiny)  # the fixed cost: other work only adds to a round (a busy spike made it 58 ms, not 4)
    host = host_rate(len(topo.peers))
    simulated = simulate(topo, policy, p, message_bytes, rounds, seed, latency, host)
    return Comparison(topo.name, policy, p, message_bytes, rounds, statistics.median(simulated),
                      statistics.median(measured), measured, latency, host, resent)


def write(results: list[Comparison], out: Path) -> None:
    """sim_validation.csv, .md and .png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sim_validation.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["topology", "policy", "p", "message_bytes", "rounds", "latency_s", "host_rate_Bps", "resent",
                    "simulated_s", "measured_s", "error"])
        for r in results:
            w.writerow([r.topology, r.policy, r.p, r.message_bytes, r.rounds, f"{r.latency_s:.4f}",
                        f"{r.host_rate:.0f}", f"{r.resent:.4f}", f"{r.simulated_s:.4f}", f"{r.measured_s:.4f}", f"{r.error:+.3f}"])
    lines = ["# Simulator vs testbed: median round time", "",
             "8 peers in network namespaces (tbf-shaped veths on one bridge, 2-core host); every peer sends "
             "one message per round to its receivers of the plan, paced at 0.95 min(D_j M_i/L_j, U_i/|R_i|) (`plan_flows`; equal sizes: D_j/indegree_j); "
             "barrier between rounds. Simulated: `p2plearn.sim.Simulator` on the same plans "
             "(`python -m p2plearn.sim.validate`), with the fixed round cost (the shortest of the 1 KB rounds "
             "on the same testbed) as its latency, and the host's CPU ceiling (all peers' traffic together, "
             f"from the fastest all-to-all rounds of {HOST_BYTES / 1e6:g} MB on {HOST_LINK_MBIT / 1000:g} Gbit/s "
             "links) as its host rate.", "",
             "| topology | policy | p | MB | rounds | latency s (1 KB rounds) | host Gbit/s | datagrams resent "
             "| simulated s | measured s | sim/measured - 1 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.topology} | {r.policy} | {r.p} | {r.message_bytes / 1e6:g} | {r.rounds} | {r.latency_s:.3f} "
              f"| {r.host_rate * 8 / 1e9:.2f} | {r.resent:.1%} | {r.simulated_s:.3f} | {r.measured_s:.3f} | {r.error:+.1%} |"
              for r in results]
    (out / "sim_validation.md").write_text("\n".join(lines) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for r in results:
        ax.scatter(r.measured_s, r.simulated_s, label=f"{r.topology} {r.policy} p={r.p}")
    top = 1.1 * max(max(r.measured_s, r.simulated_s) for r in results)
    ax.plot([0, top], [0, top], "k-", lw=0.8, label="simulated = measured")
    ax.fill_between([0, top], [0, 0.85 * top], [0, 1.15 * top], color="grey", alpha=0.15, label="±15%")
    ax.set(xlabel="measured round time (s)", ylabel="simulated round time (s)", xlim=(0, top), ylim=(0, top),
           title="Simulator vs testbed, 8 peers (median round)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "sim_validation.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m p2plearn.sim.validate", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("experiments/results"),
                        help="directory for the table (CSV, Markdown) and the plot (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="testbed rounds measured per case (default: %(default)s)")
    args = parser.parse_args(argv)
    results = []
    for name, policy, p, size in CASES:
        r = compare(TOPOLOGY_DIR / f"{name}.json", policy, p, size, args.rounds)
        print(f"{name:16s} {policy:9s} p={p} {size / 1e6:g} MB: simulated {r.simulated_s:.3f} s, "
              f"measured {r.measured_s:.3f} s ({r.error:+.1%}), latency {r.latency_s:.3f} s, {r.resent:.1%} resent, "
              f"rounds {[round(t, 3) for t in r.measured_rounds]}",
              flush=True)
        results.append(r)
    write(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
