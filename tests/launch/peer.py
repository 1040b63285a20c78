"""A peer for the launcher tests: joins the job, checks its environment, then acts as told.

    python peer.py [--exit CODE] [--fail-rank R] [--hang] [--rounds N] [--out DIR] [--wait-for PATH]

``--out DIR`` writes DIR/rank-R.json with what this peer saw (rank, size, members, pid, threads).
``--wait-for PATH``: after the rendezvous, wait until PATH exists (to hold two jobs up at once).
"""

import argparse
import json
import os
import sys
import time

import p2plearn.runtime
from p2plearn import options as opts


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit", type=int, default=0, help="exit code of --fail-rank")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--hang", action="store_true", help="sleep until killed after the rendezvous")
    parser.add_argument("--rounds", type=int, default=0, help="report this many rounds")
    parser.add_argument("--out")
    parser.add_argument("--wait-for")
    opts.add_arguments(parser)
    args = parser.parse_args()
    options = opts.Options.from_args(args)
    launched = "P2PLEARN_COORDINATOR" in os.environ
    if launched:  # what p2plearn-run promises every peer
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "P2PLEARN_JOB_ID", "P2PLEARN_JOB_KEY"):
            assert os.environ.get(var), f"{var} is not set"
        assert os.environ["P2PLEARN_JOB_KEY"] not in " ".join(sys.argv), "the key is on the command line"
    with p2plearn.runtime.init(engine_address=("127.0.0.1", 40000 + int(os.environ.get("RANK", "0"))),
                               timeout=30.0) as rt:
        assert rt.options == options
        members = sorted(rt.client.members)
        print(f"rank {rt.rank} of {rt.world_size} local {rt.local_rank}/{rt.local_world_size} members {members}")
        if args.out:
            seen = {"rank": rt.rank, "world_size": rt.world_size, "members": members, "pid": os.getpid(),
                    "pgid": os.getpgid(0), "options": options.to_env(), "job_id": rt.job_id,
                    "threads": os.environ.get("OMP_NUM_THREADS")}
            path = os.path.join(args.out, f"rank-{rt.rank}.json")
            with open(path + ".part", "w") as f:  # renamed when whole: the test polls for these files
                json.dump(seen, f)
            os.replace(path + ".part", path)
        deadline = time.monotonic() + 60
        while args.wait_for and not os.path.exists(args.wait_for) and time.monotonic() < deadline:
            time.sleep(0.05)
        for r in range(1, args.rounds + 1):
            rt.client.report(r, loss=1.0 / r, step_time=0.01)
            time.sleep(0.01)
        if rt.rank == args.fail_rank:
            # once every peer has written what it saw (a busy machine may leave one behind the others)
            deadline = time.monotonic() + 30
            while args.out and time.monotonic() < deadline and \
                    len([f for f in os.listdir(args.out) if f.startswith("rank-")]) < rt.world_size:
                time.sleep(0.01)
            print(f"rank {rt.rank} failing on purpose", file=sys.stderr)
            os._exit(args.exit)  # no clean leave: like a crash
        if args.hang:
            while True:
                time.sleep(1)
        # Rendezvous again before leaving so that no peer leaves while another still registers.
        rt.client.report(args.rounds + 1)
        if not rt.client.wait_min_clock(args.rounds + 1, 30.0):
            raise SystemExit("peers did not all finish")
    return 0


if __name__ == "__main__":
    sys.exit(main())
