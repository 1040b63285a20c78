"""A training peer that may lie: runs a training module as a p2plearn peer and, if its rank is one of
--attackers, sends each round what the attack makes of its model instead of the model.

    p2plearn-run -np 8 -- python experiments/attack_peer.py --attack "sign flip" --attackers 7 -- \\
        -m p2plearn.examples.charlm --robust clip --compress none ...

The attacks and their strengths are the virtual ones (`p2plearn.sim.attacks`, one definition), but a
real attacker knows less: not every honest model of the round, only its own (it trains and merges
honestly) and the messages it received. For alie and ipm its "honest models" are its own and the
plain float32 messages that arrived whole since its last send (with SELMCAST p=1, one or two);
sign flip, scaled, gaussian and stale need its own model only. Only the round messages lie: the
final average (which experiments/attacks_transformer.py does not read) and state transfer are honest.
Refused (one line): --filter value and --sync partitioned, whose messages are not the model.
"""
from __future__ import annotations

import argparse
import runpy
import sys

import numpy as np

import p2plearn.train.optimizer as optimizer
from p2plearn.sim.attacks import ATTACKS, Attack, parse_ranks
from p2plearn.sync import Partitioned, Synchronizer


def lie(sync: Synchronizer, attack: Attack) -> None:
    """Make `sync` send what `attack` forges from its model each round (the codec's encode gets the
    forged model) and record the whole plain float32 messages it reads, for the attacks that use
    the honest models."""
    if isinstance(sync, Partitioned) or sync.codec.filter is not None:
        raise SystemExit("attack_peer: --sync partitioned and --filter value send no whole model to forge")
    codec = sync.codec
    received: list[np.ndarray] = []  # whole models read since the last send (owned here)
    encode, read = codec.encode, sync._contributions

    def forged_encode(rnd, carried, changes=None, model=None):
        own = np.concatenate([a.ravel() for a in codec.arrays])
        forged = attack.forge(own[None], np.stack([own, *received]))[0].astype(np.float32)
        received.clear()
        ends = np.cumsum([a.size for a in codec.arrays])
        return encode(rnd, carried, changes, [f.reshape(a.shape) for f, a in
                                              zip(np.split(forged, ends[:-1]), codec.arrays)])

    def observed_read(d):
        out = read(d)
        if out is not None and all(c is not None and c.mask is None and c.chunks is None
                                   and c.values.dtype == np.float32 for c in out):
            received.append(np.concatenate([c.values.ravel() for c in out]))
        return out

    codec.encode, sync._contributions = forged_encode, observed_read


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    ours, theirs = argv[:split], argv[split + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attack", choices=("none", *ATTACKS), default="none", help="default: every rank honest")
    ap.add_argument("--attackers", type=parse_ranks, default=[], metavar="RANKS", help="e.g. 7 or 6-7")
    ap.add_argument("--seed", type=int, default=0, help="the gaussian attack's noise (default: %(default)s)")
    args = ap.parse_args(ours)
    if len(theirs) < 2 or theirs[0] != "-m":
        ap.error("after --, the training module: -m MODULE [ARGS]")
    make = optimizer.make_synchronizer

    def maybe_lying(options, layout, arrays, channel, client, seed):
        sync = make(options, layout, arrays, channel, client, seed)
        if args.attack != "none" and client.rank in args.attackers:
            lie(sync, Attack(args.attack, [client.rank], client.world_size, args.seed + 7 + client.rank))
        return sync

    optimizer.make_synchronizer = maybe_lying
    sys.argv = [theirs[1], *theirs[2:]]
    runpy.run_module(theirs[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
