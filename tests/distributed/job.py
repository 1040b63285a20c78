"""Run a job of N ranks of ``peer.py`` (one scenario) as torchrun would start them; every process is
killed when the test ends, also on failure or timeout."""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PEER = Path(__file__).with_name("peer.py")


def free_port() -> int:
    """A port with a free successor too (the coordinator takes MASTER_PORT + 1)."""
    while True:
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
        if port < 65535:
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                    return port
                except OSError:
                    continue


def run_job(tmp_path: Path, scenario: str, world_size: int = 2, timeout: float = 240.0,
            env: dict[str, str] | None = None) -> list[dict]:
    """Each rank's JSON result (``env``: variables over the job's); AssertionError with every rank's
    output when one fails."""
    results, codes, logs = run_ranks(tmp_path, scenario, world_size, timeout, env, stop_on_failure=True)
    assert all(code == 0 for code in codes), logs
    return results


def run_ranks(tmp_path: Path, scenario: str, world_size: int = 2, timeout: float = 240.0,
              env: dict[str, str] | None = None, stop_on_failure: bool = False
              ) -> tuple[list[dict | None], list[int | None], str]:
    """Each rank's JSON result (None where it wrote none), exit code and output; with
    ``stop_on_failure`` the others are killed once one fails."""
    env = {**os.environ, **(env or {}), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world_size),
           "LOCAL_WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": "1", "P2PLEARN_JOB_ID": f"dist-{secrets.token_hex(4)}",
           "P2PLEARN_JOB_KEY": secrets.token_hex(16)}
    procs = []
    try:
        for rank in range(world_size):
            out = open(tmp_path / f"rank{rank}.log", "w")
            procs.append(subprocess.Popen([sys.executable, str(PEER), scenario, str(tmp_path / f"rank{rank}.json")],
                                          env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))
            out.close()
        end = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < end:
            if stop_on_failure and any(p.poll() not in (None, 0) for p in procs):
                break  # one failed: the others would wait for it until their timeout
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    logs = "\n".join(f"--- rank {r} (exit {p.returncode}):\n{(tmp_path / f'rank{r}.log').read_text()[-3000:]}"
                     for r, p in enumerate(procs))
    files = [tmp_path / f"rank{r}.json" for r in range(world_size)]
    return [json.loads(f.read_text()) if f.exists() else None for f in files], [p.returncode for p in procs], logs
