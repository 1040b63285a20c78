"""One peer of a validation run, started inside its testbed namespace by `p2plearn.sim.validate`
(and `p2plearn.sim.tracking_testbed`).

    python -m p2plearn.sim.peer TOPOLOGY RANK ADDRESSES PORT POLICY P BYTES ROUNDS SEED

ADDRESSES: every peer's address, comma-separated, in rank order. Prints "ready"; then each line on
stdin runs one round and prints one JSON line about it (per flow: its time, datagrams and the
engine's ACK-based rate):
- "go ROUND BYTES": send BYTES to the round's receivers at their pacing rates, as the simulator
  plans them (POLICY, P, SEED; BYTES sizes the plans and the largest message);
- "send ROUND BYTES EXPECTED TO:RATE,..." (or "-" for no receivers): send BYTES to the given
  ranks at the given pacing rates (bytes/s), expecting EXPECTED messages of the round;
and waits for the sends and for the round's messages to it. ROUNDS bounds the rounds. Datagrams
are tagged with the data key of ``P2PLEARN_JOB_KEY``, as in training.
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
    sim = None
    message = np.zeros(size, dtype=np.uint8)
    with Channel(host=hosts[rank], port=port, sender_id=rank,
                 key=data_key(os.environ["P2PLEARN_JOB_KEY"], job_id="")) as channel:  # the Channel's default job
        print("ready", flush=True)
        for _ in range(rounds):
            command = sys.stdin.readline().split()
            if command[:1] == ["go"]:
                rnd, nbytes = int(command[1]), int(command[2])
                # The simulator's own plans and pacing rates: what it predicts is exactly what runs here.
                sim = sim or Simulator.from_topology(load(path), size, policy=policy, p=p, seed=seed)
                _, (src, dst, rate) = sim.plan(rnd)
                mine = src == rank
                flows = list(zip(dst[mine].tolist(), rate[mine].tolist()))
                expected = int(np.count_nonzero(dst == rank))
            elif command[:1] == ["send"]:
                rnd, nbytes, expected = int(command[1]), int(command[2]), int(command[3])
                flows = [] if command[4] == "-" else [(int(j), float(r)) for j, r in
                                                      (f.split(":") for f in command[4].split(","))]
            else:
                return
            print(json.dumps(_round(channel, hosts, port, rnd, message[:nbytes], flows, expected, rank)), flush=True)


def _round(channel: Channel, hosts: list[str], port: int, rnd: int, message: np.ndarray,
           flows: list[tuple[int, float]], expected: int, rank: int) -> dict:
    """Send `message` to each (rank, pacing rate) of `flows`, take `expected` messages of round `rnd`."""
    t0 = time.monotonic()
    handle = channel.send(rnd, [message], [(hosts[j], port, r) for j, r in flows])
    got = 0
    while got < expected:
        d = channel.recv(timeout=60)
        if d is None:
            raise SystemExit(f"peer {rank}: round {rnd}: {got} of {expected} messages in 60 s")
        got += d.msg_id == rnd
    stats = handle.wait(60)
    # Per flow: where a round's time goes (pacing, retransmission passes, the close handshake), and
    # what the receiver's ACKs say arrived.
    return {"round": rnd, "elapsed_s": time.monotonic() - t0,
            "send_s": max((s.elapsed_s for s in stats), default=0.0),
            "flows": [{"to": hosts.index(s.receiver[0]), "elapsed_s": s.elapsed_s, "sent": s.datagrams_sent,
                       "retransmitted": s.retransmitted, "passes": s.passes, "rtt_s": s.rtt_s,
                       "ack_rate": s.ack_rate, "loss_rate": s.loss_rate} for s in stats]}


if __name__ == "__main__":
    main(sys.argv[1:])
