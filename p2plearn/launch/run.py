"""p2plearn-run: start a p2plearn job, like mpirun.

    p2plearn-run -np N [options] -- python train.py [script args]
    p2plearn-run -np N [options] python train.py [script args]     (the command is the first non-option)

It starts the coordinator (a process of its own) and N peers, each with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``P2PLEARN_COORDINATOR``, ``P2PLEARN_JOB_ID``,
``P2PLEARN_JOB_KEY`` (environment only, never a command line) and the ``P2PLEARN_*`` training
options, so that ``p2plearn.init()`` finds its place in the job. Under ``mpirun`` or ``srun``
no launcher is needed: ``init()`` reads their variables and rank 0 starts the coordinator. If the
coordinator's process dies, the live peer of lowest rank starts a successor and training goes on;
the progress line follows it.

Where peers run:
  (default)              every peer on this machine
  -H h1:4,h2:4           4 peers on h1, then 4 on h2 (ssh; localhost entries run locally); every
                         host needs the same working directory and Python environment (a shared
                         file system, or the same paths); --ssh 'ssh -p 2222 -i KEY' sets how to
                         log in, --advertise ADDR where the others reach this machine
  --hostfile F           mpirun syntax: "host slots=4" per line, # comments, blank lines
  --topology T --emulate peers here; each engine paces to its topology rates and injects its loss
  --topology T --testbed peers inside network namespaces built from T (root); the coordinator
                         listens on a unix socket, which every namespace can reach; each peer's
                         P2PLEARN_ENGINE_HOST is its namespace's address, for its data engine

Output: each peer's lines prefixed with its rank ("[3] ..."); one live progress line (rounds,
rounds/s, loss, slowest peer) on a terminal, a periodic plain line otherwise; --log-dir D keeps
rank-N.log per rank, beside each rank's rounds (rank-N.jsonl, TensorBoard event files) and the
coordinator's plans; --report job.html writes a page of them at the end.

Resuming: --resume DIR restarts a stopped job from the newest step that every rank saved in
DIR with ``p2plearn.checkpoint.save`` (checked before anything starts); each peer's
``p2plearn.checkpoint.load(None, ...)`` then restores its model, optimizer and round clock from it.
A step where the job that saved it ended is named so before the peers start (they still start:
how far the script trains is the script's).

Stopping: Ctrl-C or SIGTERM stops every peer (SIGTERM, then SIGKILL to each peer's process
group) and the coordinator within 5 s. When a peer exits non-zero, one line says which rank, on
which host, how (exit code or signal) and when (seconds into the job), with its last stderr line
(the rest of its traceback is above, printed once as it came); the others are stopped.
Should the launcher itself die (kill -9, the OOM killer), each local peer notices (it looks twice a
second), writes one line to the launcher's stderr ("rank R: its launcher ... died; stopping") and
exits with code 129; a remote peer gets SIGTERM from its ssh session's watchdog once ssh's stdin
closes.

Threads: unless OMP_NUM_THREADS is set (then every peer gets it), each peer on this machine gets
OMP_NUM_THREADS = its cores / its peers (at least 1), and each remote host's peers share that
host's cores the same way; one line says so. torch takes its intra-op threads from it.

Launch-time checks (one line each, exit code 2, nothing started): flags and option values, the
hostfile and its slots against -np, the command and script (python with no script is refused: it
would read its program from stdin), ssh to each remote host, --resume's checkpoint (a complete step,
saved by a job of -np ranks), and -np against the topology's peer slots with --emulate or --testbed
(without them, one line says when -np and the topology's peers differ). A P2PLEARN_* variable that
nothing reads is named, with the nearest known one. The same mistakes found inside a peer (say by
its own checkpoint.load) end it with one line and exit code 2 under any launcher (p2plearn.rendezvous.errors).

Exit codes: 0 every rank finished; the first failed rank's code (128 + N for signal N) when one
failed; 2 bad usage (bad flags, a bad hostfile, an unreachable host or a missing script: one line
saying what and where, nothing started); 3 with --elastic when some ranks failed and the others
finished ("finished with K of N ranks"); 128 + N when the launcher itself got signal N.

Examples:
  p2plearn-run -np 4 -- python train.py --epochs 3
  p2plearn-run -np 8 --sync ssp --staleness 3 --selection selmcast --fanout 2 python train.py
  p2plearn-run -np 8 -H node1:4,node2:4 --log-dir logs -- python train.py
  p2plearn-run -np 8 --hostfile hosts.txt --loss-bound 0.05 --tolerance adaptive -- python train.py
  p2plearn-run -np 4 --topology topology/heterogeneous-4.json --emulate -- python train.py
  p2plearn-run -np 4 --resume ckpt -- python train.py
  sudo p2plearn-run -np 8 --topology topology/incast-8.json --testbed -- python train.py
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
from .env import THREADS_VAR, check_reachable, peer_env, ssh_command, threads_per_peer, torch_store
from .hosts import Host, HostError, Slot, parse_host_list, parse_hostfile, place
from .rate import RoundRate

STOP_GRACE = 2.5  # seconds between SIGTERM and SIGKILL: the 5 s bound covers both and the reaping
ELASTIC_PARTIAL = 3  # --elastic: some ranks failed, the others finished


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line instead of usage + message
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    # The whole docstring is the manual: what a job gets, where peers run, output, stopping, exit codes.
    # No abbreviations: the command's own flags (--out) must never be taken for ours (--outer-lr).
    parser = _Parser(prog="p2plearn-run", allow_abbrev=False, description=doc[:doc.index("Examples:")].strip(),
                     epilog=doc[doc.index("Examples:"):], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-np", "-n", dest="np", type=int, help="number of peers (default: the hosts' slots; "
                                                                   "required without -H/--hostfile)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-H", "--host", dest="hosts", help="hosts and slots, e.g. node1:4,node2:4 (default: every "
                                                          "peer on this machine)")
    where.add_argument("--hostfile", help="mpirun-style hostfile (default: none, every peer on this machine)")
    parser.add_argument("--oversubscribe", action="store_true", help="allow more peers than slots (default: off)")
    parser.add_argument("--testbed", action="store_true", help="run peers in namespaces built from --topology "
                                                               "(root; default: off)")
    parser.add_argument("--report", metavar="FILE", help="at the end, write one self-contained HTML page of the job "
                        "(loss curves, each rank's time split, the plan over time) from --log-dir, or from a "
                        "temporary one without it (default: none; see docs/monitor.md)")
    parser.add_argument("--elastic", action="store_true", help="keep the job running when a peer fails "
                                                               "(default: off, the first failure stops the job)")
    parser.add_argument("--resume", metavar="DIR", help="resume from the newest step every rank saved in DIR "
                                                        "(p2plearn.checkpoint; default: none, a fresh start)")
    parser.add_argument("--advertise", help="address other hosts reach this machine at "
                                            "(default: its host name; only for -H/--hostfile)")
    parser.add_argument("--ssh", default="ssh", help="the ssh command for remote hosts, with its options, e.g. "
                                                     "'ssh -p 2222 -i ~/.ssh/cluster' (default: ssh)")
    opts.add_arguments(parser)
    return parser


def parse(argv: list[str]) -> tuple[argparse.Namespace, opts.Options, list[str]]:
    """Flags, options and the peer command; raises UsageError."""
    if "--" in argv:
        flags, command = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    else:
        flags, command = argv, []
    parser = build_parser()
    if not command:
        parser.add_argument("command", nargs=argparse.REMAINDER, help="the peers' command and its arguments, after "
                            "-- or from the first non-option on (e.g. python train.py --epochs 3)")
    args = parser.parse_args(flags)
    command = command or args.command
    if not command:
        raise UsageError("no command to run (e.g. p2plearn-run -np 4 -- python train.py)")
    if args.np is not None and args.np < 1:
        raise UsageError(f"-np {args.np}: must be >= 1")
    try:
        options = opts.Options.from_args(args)
    except opts.OptionsError as exc:
        raise UsageError(str(exc)) from None
    if args.testbed and not options.topology:
        raise UsageError("--testbed needs --topology")
    if args.testbed and options.emulate:
        raise UsageError("--testbed and --emulate exclude each other (a testbed shapes real links)")
    if options.topology:
        from ..topology import nearest_shipped, resolve  # networkx: imported only for jobs with a topology

        found = resolve(options.topology)
        if not found.is_file():
            raise UsageError(f"--topology {options.topology}: no such file{nearest_shipped(options.topology)}")
        options = options.replace(topology=os.path.abspath(found))
    if options.log_dir:  # the peers' working directory may differ (remote hosts)
        options = options.replace(log_dir=os.path.abspath(options.log_dir))
    return args, options, command


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
        """Wait for the peers; returns the job's exit code (see the module docstring)."""
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
