"""``python -m p2plearn.sim train ...`` (or ``p2plearn-sim train ...``): training in virtual time.

A real run's command line becomes a virtual one by changing the launcher: the training flags
(``--sync``, ``--period``, ``--selection``, ... as ``p2plearn-run`` and ``p2plearn.init`` take them) and
the model flags of ``p2plearn.examples.mnist1d`` are the same::

    p2plearn-run -np 4 --topology topology/heterogeneous-4.json --emulate -- \\
        python -m p2plearn.examples.mnist1d --sync bsp --model mlp --hidden 1536 --eval-every 8
    p2plearn-sim train -np 4 --topology topology/heterogeneous-4.json \\
        --sync bsp --model mlp --hidden 1536 --eval-every 8
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import ExitStack

import torch

from p2plearn.examples.mnist1d import add_model_arguments, make_model
from p2plearn.monitor import SimLog, write_report
from p2plearn.options import Options, OptionsError, add_arguments
from p2plearn.sim import attacks
from p2plearn.sim.train import Progress, Settings, VirtualTraining
from p2plearn.topology import TopologyError, load
from p2plearn.train.data import mnist1d

EPILOG = """\
How time is kept: each peer's clock advances by the calibrated step time (measured once per model
and batch size on this machine, cached under ~/.cache/p2plearn/calibration.json; --recalibrate
measures again, --step-ms sets it) times its speed factor (--compute-spread); each round's
transfers by the flow-level simulator on the topology's links (rates, loss, events), planned by
the training planner from a bandwidth view fed the simulated measurements. The JSON result says
which message size the network carried (--message-bytes or the replica's) and how time was modelled.

Budget: the replicas are stepped together (sim.replicas: batched matrix products for a stack of
nn.Linear, torch.func vmap for other models); --sequential steps them one by one.
--compress and --filter value work as in training: each virtual peer has its own compressor or
value filter (residuals, error feedback), a receiver merges the decoded values that travelled, and a
message occupies its encoded bytes on the network (times --message-bytes / the replica's bytes);
the result gives bytes_per_message and bytes_ratio (to the dense float32 message).
Not simulated yet (refused with a message): --overlap, --transport-mode other than unicast,
--fragments, --tolerance layerwise with --compress, --filter value or --sync partitioned.
"""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="p2plearn-sim", description="Training at scale in virtual time.")
    commands = ap.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="N virtual peers with real model replicas on a simulated network",
                                description=__doc__.split("\n\n")[1], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(train)
    add_model_arguments(train)
    sim = train.add_argument_group("virtual time")
    sim.add_argument("-np", dest="peers", type=int, default=None,
                     help="peers (default: the topology's; if given, must match it)")
    sim.add_argument("--steps", type=int, default=0,
                     help="local steps per peer (default: --epochs over the peer's shard)")
    sim.add_argument("--message-bytes", type=float, default=None, metavar="BYTES",
                     help="bytes a message occupies on the simulated network, so that a small model stands for "
                          "a large one's communication (default: the replica's, 4 bytes per parameter)")
    sim.add_argument("--compute-spread", type=float, default=0.0, metavar="SIGMA",
                     help="stragglers: each peer's step time times exp(N(0, SIGMA)), fixed per peer and seeded "
                          "(0.5: the slowest of 16 about 2x the median; default: 0, all equal)")
    sim.add_argument("--eval-peers", type=int, default=1, metavar="K",
                     help="ranks 0..K-1 evaluated at each --eval-every; the history holds rank 0's accuracy and "
                          "their mean (default: 1)")
    sim.add_argument("--step-ms", type=float, default=None,
                     help="milliseconds per local step instead of the calibration (a reproducible clock)")
    sim.add_argument("--eval-ms", type=float, default=None,
                     help="milliseconds per evaluation instead of the calibration (0: free, e.g. when --step-ms "
                          "already includes them, as a real run's measured computation does)")
    sim.add_argument("--recalibrate", action="store_true", help="measure this machine's step time again")
    sim.add_argument("--sequential", action="store_true",
                     help="step the replicas one after another instead of together")
    sim.add_argument("--report", metavar="FILE",
                     help="write the run's page (loss curves, each peer's time split, the plan over time; see "
                          "docs/monitor.md) from --log-dir, or from a temporary one without it (default: none)")
    sim.add_argument("--colocate", type=int, default=0, metavar="CORES",
                     help="peers share hosts of CORES cores each: their compute and receive work (the engine's, "
                          "calibrated once, and the merge) serialised over them, as a testbed on one machine "
                          "(default: 0, every peer on a host of its own)")
    sim.add_argument("--hosts", type=int, default=1, metavar="N",
                     help="with --colocate: the hosts the peers share, rank r on host r mod N (default: 1)")
    sim.add_argument("--threads", type=int, default=1,
                     help="torch threads stepping the replicas; the calibrated step time stays one thread's "
                          "(default: %(default)s)")
    attacks.add_arguments(train)
    return ap


class ProgressLine:
    """Prints where a virtual run is, on stderr (stdout keeps the result): the first step at once,
    then a line every ``every`` seconds of wall time, and the last step; a run of a minute is not
    silent. ``every``: seconds between lines (smaller: a chattier log)."""

    def __init__(self, every: float = 5.0) -> None:
        self.every = every
        self._started = time.monotonic()
        self._last = -every  # the first step prints at once

    def __call__(self, p: Progress) -> None:
        now = time.monotonic() - self._started
        if now - self._last < self.every and p.step not in (1, p.steps):
            return
        self._last = now
        accuracy = f"{p.accuracy:.3f}" if p.accuracy is not None else "-"
        print(f"p2plearn-sim: step {p.step}/{p.steps} | round {p.rounds} | virtual {p.virtual_s:.1f} s | "
              f"accuracy rank 0 {accuracy} | {now:.0f} s wall", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    torch.set_num_threads(1)
    try:
        options = Options.from_args(args)
        if not options.topology:
            raise OptionsError("--topology: the network to simulate is needed")
        topology = load(options.topology)
    except (OptionsError, TopologyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    ranks = sum(topology.slots(p) for p in topology.peers)
    if args.peers is not None and args.peers != ranks:
        print(f"error: -np {args.peers}: the topology has {ranks} peers", file=sys.stderr)
        return 2
    settings = Settings(batch_size=args.batch_size, lr=args.lr, steps=args.steps, epochs=args.epochs, seed=args.seed,
                        dirichlet=args.dirichlet, eval_every=args.eval_every, eval_peers=args.eval_peers,
                        message_bytes=args.message_bytes, compute_spread=args.compute_spread,
                        step_s=args.step_ms / 1000 if args.step_ms else None,
                        eval_s=args.eval_ms / 1000 if args.eval_ms is not None else None, batched=not args.sequential,
                        recalibrate=args.recalibrate, threads=args.threads, colocate=args.colocate, hosts=args.hosts)
    if bool(args.attack) != bool(args.attackers):
        print("error: --attack and --attackers go together", file=sys.stderr)
        return 2
    if args.ignore_attackers and not args.attack:
        print("error: --ignore-attackers needs --attack and --attackers", file=sys.stderr)
        return 2
    name = f"cnn-{args.width}" if args.model == "cnn" else f"mlp-{args.hidden}"
    print(f"p2plearn-sim: {ranks} virtual peers of {name} on {topology.name}: preparing the data, the replicas and "
          f"the step time ({'given' if args.step_ms else 'calibrated once per model, then cached'})",
          file=sys.stderr, flush=True)
    with ExitStack() as stack:
        try:
            training = (attacks.attacked_training(args.attack, args.attackers, args.ignore_attackers) if args.attack
                        else VirtualTraining)
            run = training(options, settings, topology, mnist1d(args.samples), lambda: make_model(args), name)
            log_dir = options.log_dir or (stack.enter_context(tempfile.TemporaryDirectory(prefix="p2plearn-sim-"))
                                          if args.report else None)
            if log_dir:
                run.log = SimLog(log_dir, ranks, title=f"p2plearn-sim: {ranks} virtual peers of {name} on "
                                 f"{topology.name}", settings={k: v for k, v in vars(options).items() if v is not None})
                stack.callback(run.log.close)
            result = run.run(ProgressLine())
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        if args.report:
            run.log.close()
            print(f"p2plearn-sim: {write_report(log_dir, args.report)}", file=sys.stderr)
    result["options"] = {k: v for k, v in vars(options).items()}
    print(f"{result['peers']} virtual peers, {result['parameters']} parameters, message "
          f"{result['message_bytes'] / 1e6:.3g} MB ({result['message_bytes_source']}): {result['rounds']} rounds, "
          f"average p {result['average_p']:.2f}, delivered {result['delivered']:.3f}; virtual "
          f"{result['virtual_s']:.1f} s in {result['wall_s']:.1f} s wall; accuracy rank 0 "
          f"{result['own_accuracy']:.3f}, averaged {result['averaged_accuracy']:.3f}")
    if "bytes_per_message" in result:
        print(f"{result['messages']}: {result['bytes_per_message'] / 1e6:.3g} MB per message on the network, "
              f"{result['bytes_ratio']:.3f} of the dense message")
    if "attack" in result:
        print(f"--attack {args.attack} by ranks {args.attackers}: the honest models' average "
              f"{result['attack']['honest_averaged_accuracy']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
