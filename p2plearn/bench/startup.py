"""Start-up benchmark: how long a job takes from launch to its first step, and whether any start
fails or declares a live peer dead, with both cores kept busy by a CPU hog.

    python -m p2plearn.bench startup [--starts 20] [--peers 4] [--launcher mpirun|plain] [--no-hog]

Each start launches ``--peers`` processes, under Open MPI's ``mpirun`` (no ``MASTER_ADDR``: rank 0's
address is found as a user of mpirun would rely on) or as torchrun does (``plain``: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Each peer builds a ``DecentralizedOptimizer``, takes a few
steps and reports what it saw: the seconds from launch to its first step, and every ``dead``
event of the control plane (all peers stay alive here, so any is a false death). The table gives,
per start: exit codes, false deaths, and the slowest peer's time to its first step.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator


PHASES = ("python", "imports", "init", "optimizer", "first step")


def peer_main(out: str, steps: int, launched: float) -> int:
    """One peer of a start (run as ``python -m p2plearn.bench.startup --peer OUT``); records when,
    counted from the launch, it reached each of PHASES: the interpreter up, torch and p2plearn
    imported, ``init()`` (rendezvous) returned, the optimizer built (engine up, every engine
    known), the first step done."""
    phases = {"python": time.time() - launched}
    import torch

    import p2plearn
    from p2plearn.train import DecentralizedOptimizer

    phases["imports"] = time.time() - launched
    torch.set_num_threads(1)
    rt = p2plearn.init(timeout=120.0)
    phases["init"] = time.time() - launched
    events: list[str] = []
    rt.client.on_event(lambda e: events.append(f"{e.kind} {e.rank}"))
    model = torch.nn.Linear(16, 4)
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, rt)
    phases["optimizer"] = time.time() - launched
    for _ in range(steps):
        loss = model(torch.randn(8, 16)).square().mean()
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad()
        phases.setdefault("first step", time.time() - launched)
    with open(os.path.join(out, f"rank-{rt.rank}.json"), "w") as f:
        json.dump({"rank": rt.rank, "phases": phases, "events": events}, f)
    opt.close()
    return 0


@contextmanager
def cpu_hog(processes: int) -> Iterator[None]:
    """Busy loops on ``processes`` cores for the duration (killed on exit, also on failure)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def one_start(peers: int, launcher: str, steps: int = 5, timeout: float = 300.0) -> dict:
    """Launch one job; returns its exit codes, false deaths and the slowest time to a first step."""
    out = tempfile.mkdtemp(prefix="p2plearn-startup-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = "startup-" + secrets.token_hex(4)
    env = {**os.environ, "P2PLEARN_JOB_ID": job, "P2PLEARN_JOB_KEY": secrets.token_hex(32),
           "MASTER_PORT": str(port - 1), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    launched = time.time()
    peer = [sys.executable, "-m", "p2plearn.bench.startup", "--peer", out, "--steps", str(steps),
            "--launched", repr(launched)]
    if launcher == "mpirun":
        cmds = [["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(peers),
                 *[a for var in ("P2PLEARN_JOB_ID", "P2PLEARN_JOB_KEY", "MASTER_PORT", "OMP_NUM_THREADS",
                                 "PYTHONPATH") if var in env for a in ("-x", var)], *peer]]
        envs = [env]
    else:
        cmds = [peer] * peers
        envs = [{**env, "RANK": str(r), "WORLD_SIZE": str(peers), "MASTER_ADDR": "127.0.0.1"} for r in range(peers)]
    procs = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
             for c, e in zip(cmds, envs)]
    try:
        codes, logs = [], []
        for p in procs:
            try:
                logs.append(p.communicate(timeout=max(1.0, launched + timeout - time.time()))[0].decode(errors="replace"))
                codes.append(p.returncode)
            except subprocess.TimeoutExpired:
                codes.append(None)
                logs.append("(timed out)")
        results = []
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name)) as f:
                results.append(json.load(f))
        return {"codes": codes, "peers_done": len(results),
                "false_deaths": sum(e.startswith("dead") for r in results for e in r["events"]),
                # per phase, the slowest peer: the job waits for it
                "phases": {k: max(r["phases"][k] for r in results) for k in PHASES} if results else None,
                "log": "\n".join(logs)[-2000:]}
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        found = subprocess.run(["pgrep", "-f", f"p2plearn.control --job-id {job}"], capture_output=True, text=True)
        for pid in found.stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        shutil.rmtree(out, ignore_errors=True)


def run_starts(starts: int, peers: int, launcher: str, hog: bool) -> list[dict]:
    with cpu_hog(os.cpu_count() or 2) if hog else _nothing():
        return [one_start(peers, launcher) for _ in range(starts)]


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m p2plearn.bench startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=20, help="jobs started one after the other (default: %(default)s)")
    parser.add_argument("--peers", type=int, default=4, help="processes per job (default: %(default)s)")
    parser.add_argument("--launcher", choices=("mpirun", "plain"), default="mpirun" if shutil.which("mpirun") else "plain",
                        help="mpirun: Open MPI starts the peers; plain: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
                             "set as torchrun does (default here: %(default)s)")
    parser.add_argument("--no-hog", dest="hog", action="store_false", help="leave the cores idle")
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer:
        raise SystemExit(peer_main(args.peer, args.steps, args.launched))
    print(f"{args.starts} starts of {args.peers} peers under {args.launcher}, "
          f"{'a CPU hog on every core' if args.hog else 'idle cores'}")
    print("Seconds from the launch until the slowest peer reached each phase:")
    print(f"| start | exit codes | false deaths | {' | '.join(PHASES)} |")
    print("|---" * (3 + len(PHASES)) + "|")
    ok = deaths = 0
    seen: dict[str, list[float]] = {k: [] for k in PHASES}
    for i, r in enumerate(run_starts(args.starts, args.peers, args.launcher, args.hog), 1):
        good = all(c == 0 for c in r["codes"]) and r["peers_done"] == args.peers
        ok += good
        deaths += r["false_deaths"]
        for k, v in (r["phases"] or {}).items():
            seen[k].append(v)
        cells = " | ".join(f"{r['phases'][k]:.1f}" if r["phases"] else "-" for k in PHASES)
        print(f"| {i} | {r['codes']} | {r['false_deaths']} | {cells} |", flush=True)
        if not good:
            print(r["log"], file=sys.stderr)
    medians = " | ".join(f"{sorted(v)[len(v) // 2]:.1f}" if v else "-" for v in seen.values())
    print(f"| median | | | {medians} |")
    print(f"\n{ok} of {args.starts} starts succeeded; {deaths} false deaths")


if __name__ == "__main__":
    main()
