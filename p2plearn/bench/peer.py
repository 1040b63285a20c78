"""One side of a transport benchmark, run as its own process (inside a namespace on the veth path).

    python -m p2plearn.bench.peer recv KIND PORT SIZE REPS [DROP]   -> prints "ready", then one JSON line per message
    python -m p2plearn.bench.peer send KIND HOST PORT SIZE REPS BOUND RATE -> one JSON line per message
KIND: engine (tags on, as in training) | engine-untagged (tags off) | tcp (TcpChannel) | raw (a plain TCP socket).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from p2plearn.transport import Channel, TcpChannel  # noqa: E402

BENCH_KEY = bytes(range(32))  # the data-plane key both sides of a tagged run share


def _channel(kind: str, **kwargs: Any) -> Channel | TcpChannel:
    """The transport a KIND names; engines get the benchmark's key unless untagged."""
    if kind == "tcp":
        return TcpChannel(**kwargs)
    return Channel(key=BENCH_KEY if kind == "engine" else None, **kwargs)


def _raw_recv(port: int, size: int, reps: int) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    print("ready", flush=True)
    conn, _ = srv.accept()
    buf = bytearray(size)
    view = memoryview(buf)
    for _ in range(reps):
        got = 0
        while got < size:
            n = conn.recv_into(view[got:], size - got)
            if n == 0:
                return
            got += n
        conn.sendall(b"k")
        print(json.dumps({"bytes": got}), flush=True)


def _raw_send(host: str, port: int, size: int, reps: int) -> None:
    data = np.zeros(size, dtype=np.uint8)
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(reps):
        t = time.perf_counter()
        s.sendall(data)
        s.recv(1)
        print(json.dumps({"seconds": time.perf_counter() - t}), flush=True)


def main(argv: list[str]) -> None:
    role, kind = argv[0], argv[1]
    if role == "recv":
        port, size, reps = int(argv[2]), int(argv[3]), int(argv[4])
        drop = float(argv[5]) if len(argv) > 5 else 0.0
        if kind == "raw":
            return _raw_recv(port, size, reps)
        extra = {"drop_prob": drop, "seed": port} if kind != "tcp" else {}
        with _channel(kind, host="0.0.0.0", port=port, sender_id=1, **extra) as ch:
            print("ready", flush=True)
            for _ in range(reps):
                d = ch.recv(timeout=120)
                if d is None:
                    raise SystemExit("receiver: nothing arrived in 120 s")
                print(json.dumps({"delivered": d.delivered}), flush=True)
                del d
        return
    host, port, size, reps = argv[2], int(argv[3]), int(argv[4]), int(argv[5])
    bound, rate = float(argv[6]), float(argv[7])
    if kind == "raw":
        return _raw_send(host, port, size, reps)
    data = np.zeros(size, dtype=np.uint8)
    with _channel(kind, host="0.0.0.0", sender_id=0) as ch:
        for i in range(reps):
            t = time.perf_counter()
            (st,) = ch.send(i + 1, [data], [(host, port, rate)], loss_bounds=bound).wait(300)
            dt = time.perf_counter() - t
            print(json.dumps({"seconds": dt, "result": st.result, "delivered": st.delivered,
                              "retransmitted": st.retransmitted, "sent": st.datagrams_sent}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
