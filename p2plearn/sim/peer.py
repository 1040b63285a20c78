"""One peer of a validation run, started inside its testbed namespace by `p2plearn.sim.validate`.

    python -m p2plearn.sim.peer TOPOLOGY RANK ADDRESSES PORT POLICY P BYTES ROUNDS SEED

ADDRESSES: every peer's address, comma-separated, in rank order. Prints "ready"; then each line
"go ROUND BYTES" on stdin runs one round (send BYTES to the round's receivers at their pacing rates,
wait for the sends and for the messages of the round's senders) and prints one JSON line about it.
ROUNDS bounds the rounds; BYTES sizes the plans (and the largest message). Datagrams are tagged with
the data key of ``P2PLEARN_JOB_KEY``, as in training.
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from p2plearn.keys import data_key  # noqa: E402
from p2plearn.sim.simulator import Simulator  # noqa: E402
from p2plearn.topology import load  # noqa: E402
from p2plearn.transport import Channel  # noqa: E402


def main(argv: list[str]) -> None:
    path, rank, addresses, port, policy, p, size, rounds, seed = argv
    rank, port, p, size, rounds, seed = int(rank), int(port), int(p), int(size), int(rounds), int(seed)
    hosts = addresses.split(",")
    # The simulator's own plans and pacing rates: what it predicts is exactly what runs here.
    sim = Simulator.from_topology(load(path), size, policy=policy, p=p, seed=seed)
    message = np.zeros(size, dtype=np.uint8)
    with Channel(host=hosts[rank], port=port, sender_id=rank,
                 key=data_key(os.environ["P2PLEARN_JOB_KEY"])) as channel:
        print("ready", flush=True)
        for _ in range(rounds):
            command = sys.stdin.readline().split()
            if not command or command[0] != "go":
                return
            t0 = time.monotonic()
            rnd, nbytes = int(command[1]), int(command[2])
            _, (src, dst, rate) = sim.plan(rnd)
            mine = src == rank
            handle = channel.send(rnd, [message[:nbytes]], [(hosts[j], port, r) for j, r in zip(dst[mine], rate[mine])])
            expected = int(np.count_nonzero(dst == rank))
            got = []
            while len(got) < expected:
                d = channel.recv(timeout=60)
                if d is None:
                    raise SystemExit(f"peer {rank}: round {rnd}: {len(got)} of {expected} messages in 60 s")
                if d.msg_id == rnd:
                    got.append(d.delivered)
            stats = handle.wait(60)
            # Per flow: where a round's time goes (pacing, retransmission passes, the close handshake).
            flows = [{"to": hosts.index(s.receiver[0]), "elapsed_s": s.elapsed_s, "sent": s.datagrams_sent,
                      "retransmitted": s.retransmitted, "passes": s.passes, "rtt_s": s.rtt_s} for s in stats]
            print(json.dumps({"round": rnd, "elapsed_s": time.monotonic() - t0,
                              "send_s": max((s.elapsed_s for s in stats), default=0.0), "flows": flows}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
