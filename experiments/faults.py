"""Claim: training goes on through faults: a killed peer, a paused peer, a fresh joiner and the loss
of the coordinator's host cost a few rounds, not the job, and the accuracy follows a fault-free run's.

    python experiments/faults.py [--quick] [--seeds N] [--out DIR]

8 peers (experiments/fault_peer.py, started as torchrun starts peers: rank 0 starts the
coordinator's process) train the MNIST-1D CNN for D seconds after the rendezvous, BSP, selmcast
p=2, each evaluating its own model every 2 s. Two runs per seed: fault-free, and one with this
schedule (seconds after the rendezvous):

    0.20 D  SIGKILL rank 3                      (a peer dies)
    0.35 D  SIGSTOP rank 5 for 10 s, SIGCONT    (a peer pauses: declared dead, rejoins with state)
    0.50 D  start a fresh peer with --join      (a replacement joins: it gets rank 3 and a state)
    0.65 D  SIGKILL rank 0 and its coordinator  (the control plane's host dies: a successor takes over)

Full: D = 120 s, 3 seeds (~15 min). Quick: D = 50 s, 1 seed (~4 min). The figure is the mean test
accuracy of the live peers over time (2 s buckets, seed 0), faults marked; the table has the final
mean accuracy of the peers alive at the end, the rounds the slowest survivor completed, and the
rejoins and coordinator changes the peers counted.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common as c

NAME = "faults"
PEERS = 8
BUCKET_S = 2.0
PAUSE_S = 10.0
PEER = Path(__file__).resolve().parent / "fault_peer.py"
# (fraction of D, action, rank): what the faulty run does, in order.
SCHEDULE = [(0.20, "kill", 3), (0.35, "pause", 5), (0.50, "join", 3), (0.65, "kill-host", 0)]


class Job:
    """PEERS fault_peer.py processes of one run; each process's output lines, and its ready line."""

    def __init__(self, out: Path, seconds: float, seed: int) -> None:
        self.out, self.seconds, self.seed = out, seconds, seed
        with socket.socket() as probe:  # the coordinator listens on MASTER_PORT + 1
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1] - 1
        self.env = {**os.environ, "WORLD_SIZE": str(PEERS), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                    "P2PLEARN_JOB_ID": f"faults-{secrets.token_hex(4)}", "P2PLEARN_JOB_KEY": secrets.token_hex(32),
                    "PYTHONPATH": str(c.ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                    "P2PLEARN_PERIOD": "1", "P2PLEARN_FANOUT": "2"}  # measured with a round per step, p=2
        self.procs: list[subprocess.Popen] = []
        self.ready: dict[int, tuple[int, int]] = {}  # rank -> (pid, coordinator pid) of its first process
        self.lines: list[str] = []
        self._lock = threading.Lock()
        for rank in range(PEERS):
            self.start(rank, [])

    def start(self, rank: int, extra: list[str]) -> subprocess.Popen:
        argv = [c.PY, str(PEER), "--seconds", f"{self.seconds:.1f}", "--out", str(self.out),
                "--seed", str(self.seed), *extra]
        proc = subprocess.Popen(argv, env={**self.env, "RANK": str(rank)}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.procs.append(proc)
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()
        return proc

    def _pump(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip())
                if line.startswith("ready "):
                    _, rank, pid, coordinator = line.split()
                    self.ready.setdefault(int(rank), (int(pid), int(coordinator)))

    def wait_ready(self, timeout: float) -> float:
        """time.time() once every first process is training."""
        deadline = time.monotonic() + timeout
        while len(self.ready) < PEERS:
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in self.procs):
                raise RuntimeError("the job did not start:\n" + "\n".join(self.lines[-30:]))
            time.sleep(0.1)
        return time.time()

    def wait(self, timeout: float) -> list[int | None]:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return [p.poll() for p in self.procs]

    def close(self) -> None:
        """Kill whatever is left: peers (their process groups) and coordinators they started."""
        for proc in self.procs:
            if proc.poll() is None:
                _kill_group(proc.pid, signal.SIGKILL)
                proc.wait()
        found = subprocess.run(["pgrep", "-f", f"p2plearn.control --job-id {self.env['P2PLEARN_JOB_ID']}"],
                               capture_output=True, text=True)
        for pid in found.stdout.split():  # the coordinator and any successor
            _kill(int(pid), signal.SIGKILL)


def run(seed: int, seconds: float, faults: bool, out: Path) -> c.Row | None:
    out.mkdir(parents=True, exist_ok=True)
    job = Job(out, seconds, seed)
    applied: list[tuple[float, str]] = []
    try:
        start = job.wait_ready(timeout=240)
        if faults:
            for fraction, action, rank in SCHEDULE:
                _sleep_until(start + fraction * seconds)
                pid, coordinator = job.ready[rank]
                if action == "kill":
                    _kill(pid, signal.SIGKILL)
                elif action == "pause":
                    _kill(pid, signal.SIGSTOP)
                    threading.Timer(PAUSE_S, _kill, (pid, signal.SIGCONT)).start()
                elif action == "join":
                    job.start(rank, ["--join", "--until", f"{start + seconds:.3f}"])
                else:  # the host of rank 0 and of the coordinator's process
                    _kill(pid, signal.SIGKILL)
                    _kill(coordinator, signal.SIGKILL)
                applied.append((time.time() - start, f"{action} {rank}"))
        codes = job.wait(timeout=seconds + 180)
    except RuntimeError as exc:
        print(f"  failed: {exc}", file=sys.stderr)
        return None
    finally:
        job.close()
    return summarize(out, start, seconds, codes, applied)


def summarize(out: Path, start: float, seconds: float, codes: list[int | None], applied: list) -> c.Row:
    """Accuracy over time (mean over the peers that evaluated in each bucket) and end-of-run figures."""
    evaluations, finals = [], []
    for path in out.glob("rank-*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            (finals if entry.get("final") else evaluations).append(entry)
    buckets: dict[int, list[float]] = {}
    for e in evaluations:
        if 0 <= e["t"] - start <= seconds:
            buckets.setdefault(int((e["t"] - start) // BUCKET_S), []).append(e["accuracy"])
    curve = [((b + 0.5) * BUCKET_S, sum(v) / len(v)) for b, v in sorted(buckets.items())]
    return {"final_accuracy": sum(f["accuracy"] for f in finals) / max(1, len(finals)),
            "final_by_rank": {f["rank"]: round(f["accuracy"], 3) for f in finals},
            "survivors": len(finals), "clean_exits": sum(code == 0 for code in codes),
            "slowest_rounds": min((f["clock"] for f in finals), default=0),
            "rejoins": sum(f["rejoins"] for f in finals),
            "coordinator_changes": max((f["coordinator_changes"] for f in finals), default=0),
            "curve": curve, "faults": applied}


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv)
    seconds = 50.0 if args.quick else 120.0
    rows = []
    with tempfile.TemporaryDirectory(prefix="p2pexp-") as tmp:
        for scenario in ("fault-free", "faults"):
            config = {"run": scenario}
            rows += c.repeat(config, args.seeds, lambda seed, s=scenario: run(
                seed, seconds, s == "faults", Path(tmp) / f"{s}-{seed}"))
    metrics = {"final accuracy": c.metric("final_accuracy"), "peers at the end": c.metric("survivors"),
               "rounds (slowest survivor)": c.metric("slowest_rounds"), "rejoins": c.metric("rejoins"),
               "coordinator changes": c.metric("coordinator_changes")}
    setup = (f"{PEERS} peers on this 2-core machine (loopback, no emulated links), MNIST-1D CNN width 32, BSP, "
             f"default selection; each run trains {seconds:g} s after the rendezvous; {args.seeds} seed(s), "
             f"median [min-max]. Faulty run: " + "; ".join(f"{a} rank {r} at {f:.2f} D" for f, a, r in SCHEDULE)
             + f" (the pause lasts {PAUSE_S:g} s; the joiner takes the free rank 3). Final accuracy: mean own-model "
             f"test accuracy of the peers that finished. Ratio: rounds of the slowest survivor / fault-free.")
    tables = c.table(rows, ["run"], metrics, baseline=("fault-free",), ratio_of="rounds (slowest survivor)")
    c.write_results(args.out, NAME, rows, "Training through faults", setup, tables, lambda ax: draw(ax, rows, seconds))


def draw(ax, rows: list[c.Row], seconds: float) -> None:
    for row in rows:
        if row.get("ok") and row["seed"] == 0:
            ax.plot([t for t, _ in row["curve"]], [a for _, a in row["curve"]], label=row["run"])
            for t, what in row["faults"]:
                ax.axvline(t, color="grey", linestyle="--", linewidth=0.8)
                ax.text(t, 0.02, what, rotation=90, fontsize=7, va="bottom", ha="right")
    ax.set_xlim(0, seconds)
    ax.set_ylim(0, 1)
    ax.set_xlabel("seconds since the rendezvous")
    ax.set_ylabel(f"mean test accuracy of the live peers ({BUCKET_S:g} s buckets)")
    ax.set_title("8 peers: faults (dashed) vs a fault-free run, seed 0", fontsize=10)
    ax.legend(fontsize=8)


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    sys.exit(main())
