"""One peer of the multicast testbed tests, run inside a testbed namespace (test_multicast_testbed.py).

    python -m tests.transport.mcast_peer recv PORT MCAST_PORT MB
        prints "ready", then a JSON line for the message delivered (checked against what was sent),
        then one with the engine's counters and the groups joined before and after the channel's close
    python -m tests.transport.mcast_peer send MCAST_PORT MODE MB BOUND RATE WINDOW HOST:PORT...
        sends one message (two arrays: MB megabytes under loss bound BOUND, and 64 KB exact), paced at
        RATE bytes/s per receiver and in all (the uplink), with WINDOW bytes in flight (0: the default),
        MODE unicast|multicast; prints one JSON line of stats
Message msg's arrays are drawn from a generator seeded with msg, so a receiver checks them exactly.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from p2plearn.transport import Channel  # noqa: E402

KEY = bytes(range(32))
MSG = 7


def arrays(megabytes: float) -> list[np.ndarray]:
    rng = np.random.default_rng(MSG)
    return [rng.standard_normal(int(megabytes * 2**20 / 4)).astype(np.float32),
            rng.standard_normal(16384).astype(np.float32)]


def groups() -> list[str]:
    """The multicast groups this namespace's interfaces joined, but the all-hosts group."""
    out = subprocess.run(["ip", "maddr", "show"], capture_output=True, text=True, check=True).stdout
    return sorted({line.split()[1] for line in out.splitlines()
                   if line.strip().startswith("inet ") and "224.0.0.1" not in line})


def recv(port: int, mcast_port: int, megabytes: float) -> None:
    ch = Channel(host="0.0.0.0", port=port, sender_id=port, key=KEY, mcast_port=mcast_port)
    print("ready", flush=True)
    d = ch.recv(timeout=60)
    if d is None:
        raise SystemExit("receiver: nothing arrived in 60 s")
    sent = arrays(megabytes)
    print(json.dumps({"msg": d.msg_id, "fractions": d.fractions,
                      "equal": [bool(np.array_equal(a, b)) for a, b in zip(d.arrays, sent)]}), flush=True)
    del d
    joined, stats = groups(), ch.stats()
    ch.close()
    print(json.dumps({"joined": joined, "after_close": groups(), "engine": stats}), flush=True)


def send(mcast_port: int, mode: str, megabytes: float, bound: float, rate: float, window: int,
         peers: list[str]) -> None:
    receivers = [(h, int(p), rate) for h, p in (peer.split(":") for peer in peers)]
    data = arrays(megabytes)
    with Channel(host="0.0.0.0", sender_id=0, key=KEY, mcast_port=mcast_port, transport_mode=mode,
                 uplink_rate=rate, window_bytes=window or 8 << 20) as ch:
        t = time.perf_counter()
        stats = ch.send(MSG, data, receivers, loss_bounds=[bound, 0.0]).wait(120)
        elapsed = time.perf_counter() - t
        print(json.dumps({"seconds": elapsed, "bytes": sum(a.nbytes for a in data), "engine": ch.stats(),
                          "receivers": [{"result": st.result, "multicast": st.multicast, "fractions": st.fractions,
                                         "passes": st.passes} for st in stats]}), flush=True)


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "recv":
        recv(int(args[0]), int(args[1]), float(args[2]))
    else:
        send(int(args[0]), args[1], float(args[2]), float(args[3]), float(args[4]), int(args[5]), args[6:])
