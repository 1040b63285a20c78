"""The coordinator in a process of its own: ``python -m p2plearn.control [options]``.

A peer's imports and compute hold its interpreter for seconds at a time (torch's first import,
say); a coordinator thread inside it would fall silent with it and the others would take it for
dead. In its own process it cannot be starved that way, and it outlives the process that started
it: a job whose rank 0 dies keeps its coordinator.

The job key is read from ``P2PLEARN_JOB_KEY`` (never from the command line, which ``ps`` shows to
every user). Once bound, the server prints one JSON line ``{"address": ..., "pub": ...}`` on
stdout; then it serves until it is told of a successor, until the job has had no registered member
for ``--linger`` seconds, until nobody registered in ``--startup-timeout`` seconds, or until
SIGTERM; unless a successor took over, it tells its clients that the job ended as it stops.
``spawn()`` starts one and returns once it is bound.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import zmq

from ..keys import control_key
from . import protocol as p
from .coordinator import Coordinator
from .estimator import rates_from_file

KEY_VAR = "P2PLEARN_JOB_KEY"
DASHBOARD_VAR = "P2PLEARN_DASHBOARD"
LOG_DIR_VAR = "P2PLEARN_LOG_DIR"


@dataclass
class ServerProcess:
    """A running coordinator process: where it serves, and how to stop it."""

    proc: subprocess.Popen
    address: str
    pub_address: str

    def stop(self, timeout: float = 3.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def alive(self) -> bool:
        return self.proc.poll() is None


def spawn(job_id: str, key: str | bytes, *, bind: str, advertise: str | None = None, world_size: int = 0,
          heartbeat: float = 0.5, phi_threshold: float = 8.0, startup_grace: float = 60.0,
          topology: str | None = None, term: int = 0, previous: str | None = None, linger: float = 10.0,
          startup_timeout: float = 120.0, dashboard: str | None = None, log_dir: str | None = None,
          timeout: float = 30.0) -> ServerProcess:
    """Start a coordinator process and wait (up to ``timeout`` s) until it is bound.

    ``previous``: the endpoint of the coordinator it succeeds, told to step down. ``linger`` /
    ``startup_timeout``: it exits once the job has had no registered member for ``linger`` s, or
    when none registered within ``startup_timeout`` s. Raises RuntimeError with the process's own
    error when it fails to start (a port in use, say). ``dashboard``: ``[HOST:]PORT`` of the job's
    page (``p2plearn.monitor``); None: ``P2PLEARN_DASHBOARD`` if set (a successor started by a
    peer inherits the peer's), else no page. ``log_dir``: where it writes its plans and events
    (``p2plearn.monitor.PlanLog``); None: ``P2PLEARN_LOG_DIR`` if set, else nowhere.
    """
    argv = [sys.executable, "-m", "p2plearn.control", "--job-id", job_id, "--bind", bind,
            "--world-size", str(world_size), "--heartbeat", str(heartbeat), "--phi-threshold", str(phi_threshold),
            "--startup-grace", str(startup_grace), "--term", str(term), "--linger", str(linger),
            "--startup-timeout", str(startup_timeout)]
    for flag, value in (("--advertise", advertise), ("--topology", topology), ("--previous", previous),
                        ("--dashboard", dashboard), ("--log-dir", log_dir)):
        if value:
            argv += [flag, value]
    env = {**os.environ, KEY_VAR: key.hex() if isinstance(key, bytes) else key}
    # Its own session: a Ctrl-C meant for the peer's terminal group does not take the job's
    # coordinator with it; it ends by itself once the job has no member.
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else b""
    if not line:
        proc.kill()
        proc.wait()
        why = proc.stderr.read().decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"the coordinator process did not start within {timeout:g} s"
                           + (f": {why[-1]}" if why else ""))
    info = json.loads(line)
    # Later stderr lines (warnings, a crash) go to ours, without a thread per line.
    threading.Thread(target=_forward, args=(proc.stderr,), daemon=True).start()
    return ServerProcess(proc, info["address"], info["pub"])


def _forward(stream) -> None:
    for raw in iter(stream.readline, b""):
        sys.stderr.write("[coordinator] " + raw.decode(errors="replace"))
    stream.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m p2plearn.control", description=__doc__.split("\n\n")[0])
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--bind", required=True, help="ZeroMQ endpoint, e.g. tcp://0.0.0.0:29451 or ipc:///tmp/j/ctl")
    parser.add_argument("--advertise", help="the host clients use when --bind is a wildcard address")
    parser.add_argument("--world-size", type=int, default=0)
    parser.add_argument("--heartbeat", type=float, default=0.5)
    parser.add_argument("--phi-threshold", type=float, default=8.0)
    parser.add_argument("--startup-grace", type=float, default=60.0)
    parser.add_argument("--topology", help="topology file seeding the bandwidth view")
    parser.add_argument("--term", type=int, default=0, help="incarnation: a successor's is its predecessor's + 1")
    parser.add_argument("--previous", help="endpoint of the coordinator this one succeeds (told to step down)")
    parser.add_argument("--linger", type=float, default=10.0, help="exit after this long without any member")
    parser.add_argument("--startup-timeout", type=float, default=120.0, help="exit if nobody registers in this long")
    parser.add_argument("--dashboard", default=os.environ.get(DASHBOARD_VAR) or None, metavar="[HOST:]PORT",
                        help=f"serve the job's page and /metrics there (default: ${DASHBOARD_VAR}, else none)")
    parser.add_argument("--log-dir", default=os.environ.get(LOG_DIR_VAR) or None, metavar="DIR",
                        help=f"write the plans and events there (default: ${LOG_DIR_VAR}, else nowhere)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(message)s", level=logging.WARNING)  # deaths and hand-overs, on stderr
    key = os.environ.get(KEY_VAR)
    if not key:
        print(f"{parser.prog}: error: {KEY_VAR} is not set", file=sys.stderr)
        return 2
    rates = rates_from_file(args.topology) if args.topology else None
    coordinator = Coordinator(args.job_id, key, world_size=args.world_size, bind=args.bind, advertise=args.advertise,
                              heartbeat=args.heartbeat, phi_threshold=args.phi_threshold,
                              startup_grace=args.startup_grace, rates=rates, term=args.term)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    dashboard = _dashboard(coordinator, args.dashboard, key, args.advertise) if args.dashboard else None
    plan_log = _plan_log(coordinator, args.log_dir) if args.log_dir else None
    coordinator.start()
    print(json.dumps({"address": coordinator.address, "pub": coordinator.pub_address}), flush=True)
    if dashboard is not None:
        print(f"p2plearn dashboard of job {args.job_id} (term {args.term}): {dashboard.url}", file=sys.stderr, flush=True)
    if args.previous:
        _step_down(args.previous, args.job_id, key, args.term, coordinator.address)
        coordinator.take_over(args.previous)
    try:
        serve_while_needed(coordinator, stop, linger=args.linger, startup_timeout=args.startup_timeout)
    finally:
        coordinator.end()
        if dashboard is not None:
            dashboard.stop()
        if plan_log is not None:
            plan_log.stop()
    return 0


def _dashboard(coordinator: Coordinator, address: str, key: str, advertise: str | None):
    """The job's page (``p2plearn.monitor``), imported only when asked for; a bad address is said
    and the job goes on without a page (the coordinator matters more than its page)."""
    from ..monitor import attach

    try:
        return attach(coordinator, address, key, advertise=advertise)
    except (ValueError, OSError) as exc:
        print(f"p2plearn dashboard: not served: {exc}", file=sys.stderr, flush=True)
        return None


def _plan_log(coordinator: Coordinator, log_dir: str):
    """--log-dir's plan log (``p2plearn.monitor``); a directory it cannot write is said, and the job goes on."""
    from ..monitor import log_plans

    try:
        return log_plans(coordinator, log_dir)
    except OSError as exc:
        print(f"p2plearn --log-dir: no plan log: {exc}", file=sys.stderr, flush=True)
        return None


def serve_while_needed(coordinator: Coordinator, stop: threading.Event, *, linger: float,
                       startup_timeout: float) -> None:
    """Return once ``stop`` is set, the coordinator stopped serving (it stepped down), the job has
    had no registered member for ``linger`` seconds, or none registered within ``startup_timeout``.
    Members a successor presumes from a hand-over do not count until they register themselves."""
    started = last_member = time.monotonic()
    while not stop.wait(0.1) and coordinator.serving:
        now = time.monotonic()
        if coordinator.registered():
            last_member = now
        elif coordinator.registrations and now - last_member >= linger:
            return  # every peer that registered left (or died)
        elif not coordinator.registrations and now - started >= startup_timeout:
            return


def _step_down(endpoint: str, job_id: str, key: str, term: int, successor: str) -> None:
    """Tell a predecessor that may still be alive (a false suspicion) to send its clients here."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(p.endpoint(endpoint))
        sock.send_multipart(p.pack(control_key(key), job_id, {"type": p.STEP_DOWN, "term": term,
                                                             "endpoint": successor, "id": 0}), flags=zmq.NOBLOCK)
        sock.poll(1000)  # a dead predecessor never answers; a live one answers at once
    except zmq.ZMQError:
        pass
    finally:
        sock.close()

