"""p2plearn-run's job (`Launcher`): the coordinator's process, the peers (here, over ssh, or in
testbed namespaces) and their output, supervised until the job ends; `main` checks everything first.
The manual (what ``p2plearn-run --help`` prints) is ``p2plearn.launch.cli``'s docstring.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import IO, Any

from .. import checkpoint
from .. import options as opts
from ..control import Client, Progress
from ..control.server import ServerProcess, spawn
from ..rendezvous.variables import ENGINE_HOST_VAR, KEY_VAR, LAUNCHER_FD_VAR, LAUNCHER_PID_VAR
from .checks import UsageError, check_command, check_testbed, topology_rates
from .cli import build_parser, parse
from .env import THREADS_VAR, check_reachable, peer_env, ssh_command, threads_per_peer, torch_store
from .hosts import Host, HostError, Slot, parse_host_list, parse_hostfile, place
from .rate import RoundRate

STOP_GRACE = 2.5  # seconds between SIGTERM and SIGKILL: the 5 s bound covers both and the reaping
ELASTIC_PARTIAL = 3  # --elastic: some ranks failed, the others finished

# build_parser and parse are cli.py's, imported from here too.
__all__ = ["Launcher", "main", "report", "build_parser", "parse", "UsageError"]


class _ControlPlane:
    """The job's coordinator process, and a client of the launcher's own that reads the progress
    from its ticks and follows it to a successor should it die."""

    def __init__(self, server: ServerProcess, job_id: str, key: str) -> None:
        self.server = server
        self.address = server.address
        try:
            self._observer = Client(server.address, job_id, key)
        except BaseException:
            server.stop()
            raise

    def progress(self) -> Progress:
        return self._observer.progress or Progress(0, 0, 0, None, None)

    def final_progress(self, wait: float) -> Progress:
        """The progress once the peers are gone: the tick in hand may be older than their last
        rounds (or than a job shorter than a tick), so wait up to ``wait`` seconds for one that
        carries their last clocks: a tick after every peer left."""
        deadline = time.monotonic() + wait
        while ((progress := self.progress()).max_clock == 0 or progress.alive) and time.monotonic() < deadline:
            time.sleep(0.05)
        return progress

    def stop(self) -> None:
        self._observer.close()
        self.server.stop()


@dataclass
class _Peer:
    slot: Slot
    proc: subprocess.Popen
    readers: list[threading.Thread] = field(default_factory=list)
    code: int | None = None


class Launcher:
    """One job: the coordinator, the peers and their output. ``run()`` returns the exit code."""

    def __init__(self, args: argparse.Namespace, options: opts.Options, command: list[str],
                 rates: dict[int, tuple[float, float]] | None = None) -> None:
        from .output import Output  # rich is imported only when a job runs, not for --help

        self.args = args
        self.options = options
        self.command = command
        self.rates = rates
        self.job_id = secrets.token_hex(6)
        self.key = secrets.token_hex(32)
        self.output = Output(options.log_dir)
        self.peers: list[_Peer] = []
        self._started = time.monotonic()
        self._signal: int | None = None
        self._wake = threading.Event()
        # Local peers inherit a copy of our stderr: should we die, each says so there in one line.
        self._stderr_copy = os.dup(2)

    def run(self, slots: list[Slot]) -> int:
        with ExitStack() as stack:
            previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
            stack.callback(lambda: [signal.signal(s, h) for s, h in previous.items()])
            stack.callback(self.output.close)
            stack.callback(os.close, self._stderr_copy)
            coordinator = self._coordinator(slots, stack)
            stack.callback(coordinator.stop)
            testbed = self._testbed(stack) if self.args.testbed else None
            stack.callback(self._stop_all)  # runs first: peers stop before their namespaces go
            if self.args.resume:
                newest = checkpoint.resumable(self.args.resume, len(slots))
                partial = checkpoint.skipped(self.args.resume, len(slots), newest)
                self.output.message(partial or f"resuming from step {newest} of {self.args.resume}" + (
                    ", where the job that saved it ended: nothing left to train unless the script goes further"
                    if checkpoint.ended(self.args.resume, newest) else ""))
            chosen = os.environ.get(THREADS_VAR)  # the user's choice, for every host
            local_threads = chosen or self._share_threads(slots)
            store = torch_store(slots, self.args.advertise, testbed.address(0) if testbed else None)
            for slot in slots:
                env = peer_env(slot, len(slots), coordinator.address, self.job_id, self.options, store)
                if slot.host.local or chosen:  # without a choice, a remote host computes its own share
                    env[THREADS_VAR] = local_threads
                if self.args.resume:
                    env[checkpoint.RESUME_VAR] = self.args.resume
                self._start(slot, env, testbed)
            return self._supervise(coordinator, len(slots))

    def _share_threads(self, slots: list[Slot]) -> str:
        """``OMP_NUM_THREADS`` for the peers on this host: its cores shared among them (as torchrun
        sets it); said once."""
        local = sum(s.host.local for s in slots)
        threads = threads_per_peer(max(1, local))
        here = (f"{THREADS_VAR}={threads} for each of the {local} peers here ({len(os.sched_getaffinity(0))} cores)"
                if local else "")
        remote = "each remote host's peers share its cores" if local < len(slots) else ""
        self.output.message("; ".join(filter(None, (here, remote))) + f"; set {THREADS_VAR} to choose")
        return str(threads)

    def _coordinator(self, slots: list[Slot], stack: ExitStack) -> _ControlPlane:
        if self.args.testbed:
            # Namespaces share the file system, not the loopback: a unix socket reaches them all.
            bind = "ipc://" + os.path.join(stack.enter_context(tempfile.TemporaryDirectory(prefix="p2plearn-")), "ctl")
        elif all(s.host.local for s in slots):
            bind = "tcp://127.0.0.1:0"
        else:
            bind = "tcp://0.0.0.0:0"
        server = spawn(self.job_id, self.key, bind=bind, advertise=self.args.advertise or os.uname().nodename,
                       world_size=len(slots), heartbeat=self.options.heartbeat,
                       phi_threshold=self.options.phi_threshold, topology=self.options.topology,
                       dashboard=self.options.dashboard, log_dir=self.options.log_dir)
        return _ControlPlane(server, self.job_id, self.key)

    def _testbed(self, stack: ExitStack) -> Any:
        from p2plearn.testbed import Testbed

        return stack.enter_context(Testbed(self.options.topology))

    def _start(self, slot: Slot, env: dict[str, str], testbed: Any) -> None:
        popen: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "start_new_session": True}
        if slot.host.local:
            full_env = {**os.environ, **env, KEY_VAR: self.key, LAUNCHER_PID_VAR: str(os.getpid()),
                        LAUNCHER_FD_VAR: str(self._stderr_copy)}
            popen["pass_fds"] = (self._stderr_copy,)
            if testbed is not None:
                full_env[ENGINE_HOST_VAR] = testbed.address(slot.rank)
                proc = testbed.run(slot.rank, self.command, env=full_env, **popen)
            else:
                proc = subprocess.Popen(self.command, env=full_env, **popen)
        else:
            proc = subprocess.Popen(ssh_command(slot.host.name, env, self.command, os.getcwd(), self.args.ssh),
                                    stdin=subprocess.PIPE, **popen)
            proc.stdin.write((self.key + "\n").encode())
            proc.stdin.flush()  # stays open: closing it stops the remote peer
        peer = _Peer(slot, proc)
        self.output.peer(slot.rank)
        for stream, err in ((proc.stdout, False), (proc.stderr, True)):
            t = threading.Thread(target=self._pump, args=(slot.rank, stream, err), daemon=True)
            t.start()
            peer.readers.append(t)
        self.peers.append(peer)

    def _pump(self, rank: int, stream: IO[bytes], err: bool) -> None:
        for raw in iter(stream.readline, b""):
            self.output.line(rank, raw.decode(errors="replace").rstrip("\n"), err)
        stream.close()

    def _supervise(self, coordinator: _ControlPlane, world_size: int) -> int:
        """Wait for the peers; returns the job's exit code (see the manual: cli.py's docstring)."""
        failed: list[_Peer] = []
        rate = RoundRate()
        while self._signal is None:
            running = 0
            for peer in self.peers:
                if peer.code is None and (code := peer.proc.poll()) is not None:
                    peer.code = code
                    for t in peer.readers:
                        t.join(timeout=1.0)  # its last stderr lines belong in the report
                    if code != 0:
                        self._report_failure(peer)
                        failed.append(peer)
                        if not self.args.elastic:
                            return _exit_code(code)
                running += peer.code is None
            if not running:
                self.output.progress(coordinator.final_progress(wait=1.5), None, world_size, final=True)
                finished = sum(p.code == 0 for p in self.peers)
                if not failed:
                    return 0
                if finished:
                    self.output.message(f"finished with {finished} of {len(self.peers)} ranks")
                    return ELASTIC_PARTIAL
                return _exit_code(failed[0].code or 0)
            progress = coordinator.progress()
            self.output.progress(progress, rate.update(time.monotonic(), progress.min_clock), world_size)
            self._wake.wait(0.1)
        self.output.message(f"stopping on {signal.Signals(self._signal).name}")
        return 128 + self._signal

    def _report_failure(self, peer: _Peer) -> None:
        """One line: which rank, where, how and when; its stderr was printed as it came."""
        code = peer.code or 0
        how = f"exit code {code}" if code > 0 else f"signal {signal.Signals(-code).name}"
        tail = self.output.stderr_tail(peer.slot.rank)
        last = f"; its last stderr line: {tail[-1].strip()}" if tail else "; it wrote nothing to stderr"
        self.output.message(f"rank {peer.slot.rank} (on {peer.slot.host.name}) failed with {how} "
                            f"{time.monotonic() - self._started:.1f} s into the job{last}")
        if not self.args.elastic:
            self.output.message("stopping the other peers")

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signal = signum
        self._wake.set()

    def _stop_all(self) -> None:
        """SIGTERM to every peer's process group, SIGKILL to what is left after the grace period."""
        for peer in self.peers:
            if peer.proc.stdin:
                peer.proc.stdin.close()  # a remote peer's watchdog sees this
            _signal_group(peer.proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for peer in self.peers:
            try:
                peer.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for peer in self.peers:
            _signal_group(peer.proc, signal.SIGKILL)  # also children the peer left behind
            peer.proc.wait()
            for t in peer.readers:
                t.join(timeout=0.5)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def _exit_code(code: int) -> int:
    return code if code > 0 else 128 - code


def report(log_dir: str, path: str) -> str:
    """--report: write the job's page from its log directory (``p2plearn.monitor``); what it holds, or why not."""
    from ..monitor import write_report

    try:
        return write_report(log_dir, path)
    except OSError as exc:
        return f"--report: not written: {exc}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``p2plearn-run``; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args, options, command = parse(argv)
        if args.hostfile:
            hosts = parse_hostfile(args.hostfile)
        elif args.hosts:
            hosts = parse_host_list(args.hosts)
        else:
            if args.np is None:
                raise UsageError("-np is required without -H or --hostfile")
            hosts = [Host("localhost", args.np, "default")]
        slots = place(hosts, args.np or sum(h.slots for h in hosts), args.oversubscribe)
        used = list({s.host.name: s.host for s in slots}.values())
        if args.testbed and not all(h.local for h in used):
            raise UsageError("--testbed runs every peer on this machine: drop -H/--hostfile")
        check_command(command, local=any(h.local for h in used))
        if args.resume:
            try:
                checkpoint.resumable(args.resume, len(slots))
            except checkpoint.CheckpointError as exc:
                raise UsageError(f"--resume: {exc}") from None
            args.resume = os.path.abspath(args.resume)
        if args.testbed:
            check_testbed()
        rates = topology_rates(options.topology) if options.topology else None
        if (args.testbed or options.emulate) and len(slots) > len(rates or {}):
            # Each rank takes the topology's peer slot of its number: found here, not in 8 tracebacks.
            flag, have = "--testbed" if args.testbed else "--emulate", len(rates or {})
            raise UsageError(f"{flag}: -np {len(slots)} but {options.topology} has {have} peer slots "
                             f"(use -np {have} or a topology with {len(slots)})")
        check_reachable(used, ssh=args.ssh)
    except (UsageError, HostError) as exc:
        print(f"p2plearn-run: error: {exc}", file=sys.stderr)
        return 2
    for line in opts.unknown_variables(os.environ):
        print(line, file=sys.stderr)
    if rates is not None and len(slots) != len(rates):  # allowed (the topology seeds the view), yet seldom meant
        print(f"p2plearn-run: note: -np {len(slots)} but {options.topology} has {len(rates)} peers: the coordinator's "
              f"view takes each rank's rates from the peer of its number", file=sys.stderr)
    if not args.report:
        return Launcher(args, options, command, rates).run(slots)
    with tempfile.TemporaryDirectory(prefix="p2plearn-log-") as scratch:
        options = options if options.log_dir else options.replace(log_dir=scratch)
        code = Launcher(args, options, command, rates).run(slots)
        print(f"p2plearn-run: {report(options.log_dir, args.report)}", file=sys.stderr)
    return code
