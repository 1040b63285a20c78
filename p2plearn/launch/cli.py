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

from .. import options as opts
from .checks import UsageError


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
