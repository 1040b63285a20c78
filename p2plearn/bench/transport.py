"""Transport benchmark: the engine against TcpChannel, a raw TCP socket and iperf3, in one run.

    python -m p2plearn.bench transport [--json] [--megabytes 256] [--reps 2] [--no-veth]

Paths: loopback; and, when root, a veth pair between two network namespaces (unshaped, and shaped
by tbf at 100 Mbit/s and 1 Gbit/s with a 64 KB queue). Each configuration moves one message of the
given size `reps` times (sender and receiver are separate processes) and reports the median.
Targets (issue 2): engine goodput >= 0.8x raw TCP on the unshaped veth pair; on a shaped link,
goodput >= 0.95 of the shaped rate with <= 1% of datagrams dropped at the queue. "engine" runs with
AES-256-GMAC tags on, as training does; "engine-untagged" without, for the tags' cost ("x untagged",
issue 17's target: >= 0.8).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Iterator

PEER = [sys.executable, "-m", "p2plearn.bench.peer"]


@dataclass
class Path:
    name: str
    sender_ns: str | None = None
    receiver_ns: str | None = None
    receiver_host: str = "127.0.0.1"
    shaped_mbit: float | None = None
    sender_dev: str | None = None

    def wrap(self, ns: str | None, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv] if ns else argv

    def queue_drops(self) -> int:
        if not self.sender_dev:
            return 0
        out = subprocess.run(self.wrap(self.sender_ns, ["tc", "-s", "qdisc", "show", "dev", self.sender_dev]),
                             capture_output=True, text=True).stdout
        return sum(int(n) for n in re.findall(r"dropped (\d+)", out))


@dataclass
class Result:
    path: str
    transport: str
    loss: float
    bound: float
    megabytes: float
    seconds: float
    goodput_mbit: float
    runs: list[float] = field(default_factory=list)
    delivered: float = 1.0
    retransmitted: int = 0
    datagrams: int = 0
    queue_drops: int = 0
    note: str = ""


def _run_pair(path: Path, kind: str, size: int, reps: int, loss: float, bound: float, rate: float,
              port: int) -> list[dict]:
    recv = subprocess.Popen(path.wrap(path.receiver_ns, [*PEER, "recv", kind, str(port), str(size), str(reps),
                                                         str(loss)]),
                            stdout=subprocess.PIPE, text=True)
    try:
        if recv.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{kind} receiver did not start")
        send = subprocess.run(path.wrap(path.sender_ns, [*PEER, "send", kind, path.receiver_host, str(port),
                                                         str(size), str(reps), str(bound), str(rate)]),
                              capture_output=True, text=True, timeout=600)
        if send.returncode:
            raise RuntimeError(f"{kind} sender failed: {send.stderr.strip()[-500:]}")
        recv.wait(60)
        return [json.loads(line) for line in send.stdout.splitlines() if line.startswith("{")]
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()


def _iperf3(path: Path, size: int, port: int) -> float | None:
    """Seconds iperf3 (TCP) takes to move `size` bytes, or None when it is not installed."""
    if not shutil.which("iperf3"):
        return None
    srv = subprocess.Popen(path.wrap(path.receiver_ns, ["iperf3", "-s", "-1", "-p", str(port)]),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            cli = subprocess.run(path.wrap(path.sender_ns, ["iperf3", "-c", path.receiver_host, "-p", str(port),
                                                            "-n", str(size), "-J"]),
                                 capture_output=True, text=True, timeout=300)
            # iperf3 can exit 0 with an error in its JSON (a server not yet listening): try again
            end = json.loads(cli.stdout or "{}").get("end", {}).get("sum_received") if cli.returncode == 0 else None
            if end:
                return end["bytes"] * 8 / end["bits_per_second"]
            subprocess.run(["sleep", "0.1"])
        return None
    finally:
        srv.kill()
        srv.wait()


def measure(path: Path, kind: str, size: int, reps: int, loss: float = 0.0, bound: float = 0.0,
            port: int = 47100) -> Result:
    rate = path.shaped_mbit * 1e6 / 8 if path.shaped_mbit and kind.startswith("engine") else 0.0
    drops0 = path.queue_drops()
    if kind == "iperf3":
        secs = _iperf3(path, size, port)
        runs = [{"seconds": secs}] if secs else []
    else:
        runs = _run_pair(path, kind, size, reps, loss, bound, rate, port)
    if not runs:
        return Result(path.name, kind, loss, bound, size / 2**20, float("nan"), float("nan"), note="not run")
    secs = statistics.median(r["seconds"] for r in runs)
    return Result(path.name, kind, loss, bound, size / 2**20, secs, size * 8 / secs / 1e6,
                  runs=[r["seconds"] for r in runs],
                  delivered=statistics.median(r.get("delivered", 1.0) for r in runs),
                  retransmitted=int(statistics.median(r.get("retransmitted", 0) for r in runs)),
                  datagrams=sum(r.get("sent", 0) for r in runs),
                  queue_drops=path.queue_drops() - drops0)


@contextlib.contextmanager
def veth_pair(shaped_mbit: float | None) -> Iterator[Path]:
    """Two namespaces joined by a veth pair; the sender's side shaped by tbf when asked. Always removed."""
    tag = f"p2pb{os.getpid() % 10000}"
    a, b = f"{tag}a", f"{tag}b"
    sh = lambda *cmd: subprocess.run(cmd, check=True, capture_output=True)  # noqa: E731
    try:
        sh("ip", "netns", "add", a)
        sh("ip", "netns", "add", b)
        sh("ip", "link", "add", "va", "netns", a, "type", "veth", "peer", "name", "vb", "netns", b)
        for ns, dev, ip in ((a, "va", "10.99.0.1/24"), (b, "vb", "10.99.0.2/24")):
            sh("ip", "-n", ns, "addr", "add", ip, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        name = "veth"
        if shaped_mbit:
            burst = max(16, int(shaped_mbit * 1e6 / 8 / 1000 / 1024))  # ~1 ms at the rate, in KB
            sh("ip", "netns", "exec", a, "tc", "qdisc", "replace", "dev", "va", "root", "tbf",
               "rate", f"{shaped_mbit}mbit", "burst", f"{burst}kb", "limit", "64kb")
            name = f"veth tbf {shaped_mbit:g} Mbit/s"
        yield Path(name, a, b, "10.99.0.2", shaped_mbit, "va")
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _can_use_namespaces() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def run(megabytes: float, reps: int, veth: bool) -> list[Result]:
    size = int(megabytes * 2**20)
    results: list[Result] = []

    def suite(path: Path, size: int, lossy: bool) -> None:
        for kind in ("engine", "engine-untagged", "tcp", "raw", "iperf3"):
            results.append(measure(path, kind, size, reps))
            print(f"  {path.name:22s} {kind:8s} {results[-1].goodput_mbit:9.0f} Mbit/s", file=sys.stderr)
        if lossy:
            for loss in (0.01, 0.05):
                for bound in (0.0, 0.01, 0.05):
                    results.append(measure(path, "engine", size, reps, loss, bound))
                    print(f"  {path.name:22s} engine loss {loss} bound {bound}: "
                          f"{results[-1].goodput_mbit:9.0f} Mbit/s", file=sys.stderr)

    suite(Path("loopback"), size, lossy=True)
    if veth and _can_use_namespaces():
        with veth_pair(None) as p:
            suite(p, size, lossy=True)
        for mbit, mb in ((100, min(megabytes, 32)), (1000, min(megabytes, 128))):
            with veth_pair(mbit) as p:
                for kind in ("engine", "raw"):
                    results.append(measure(p, kind, int(mb * 2**20), reps))
                    print(f"  {p.name:22s} {kind:8s} {results[-1].goodput_mbit:9.0f} Mbit/s", file=sys.stderr)
    return results


def table(results: list[Result]) -> str:
    base = {(r.path, r.transport): r for r in results if r.loss == 0}
    lines = ["| path | transport | injected loss | bound | MB | goodput Mbit/s | x raw TCP | x TcpChannel "
             "| x untagged | x shaped rate | delivered | retransmitted | queue drops |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        raw, tcp = base.get((r.path, "raw")), base.get((r.path, "tcp"))
        untagged = base.get((r.path, "engine-untagged")) if r.transport == "engine" and r.loss == 0 else None
        ratio = lambda b: f"{r.goodput_mbit / b.goodput_mbit:.2f}" if b and b.goodput_mbit > 0 else "-"  # noqa: E731
        shaped = next((float(m) for m in re.findall(r"tbf ([\d.]+)", r.path)), None)
        drops = f"{r.queue_drops} ({r.queue_drops / r.datagrams:.2%})" if r.datagrams and shaped else str(r.queue_drops)
        lines.append(f"| {r.path} | {r.transport} | {r.loss:g} | {r.bound:g} | {r.megabytes:g} | "
                     f"{r.goodput_mbit:.0f} | {ratio(raw)} | {ratio(tcp)} | {ratio(untagged)} | "
                     f"{r.goodput_mbit / shaped:.3f} | " if shaped else
                     f"| {r.path} | {r.transport} | {r.loss:g} | {r.bound:g} | {r.megabytes:g} | "
                     f"{r.goodput_mbit:.0f} | {ratio(raw)} | {ratio(tcp)} | {ratio(untagged)} | - | ")
        lines[-1] += f"{r.delivered:.3f} | {r.retransmitted} | {drops} |"
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m p2plearn.bench transport", description=__doc__.splitlines()[0])
    ap.add_argument("--megabytes", type=float, default=256, help="size of the message each run moves (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=2,
                    help="runs per configuration; the table gives their median (default: %(default)s)")
    ap.add_argument("--no-veth", action="store_true", help="loopback only (also the default when not root)")
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON instead of a table")
    args = ap.parse_args(argv)
    results = run(args.megabytes, args.reps, not args.no_veth)
    print(json.dumps([asdict(r) for r in results], indent=1) if args.json else table(results))


if __name__ == "__main__":
    main(sys.argv[1:])
