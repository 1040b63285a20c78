"""One peer of a synthetic training round (run by loss_tolerance_vs_tcp.py inside a testbed namespace).

    python experiments/exchange_peer.py KIND RANK JSON_CONFIG OUT.json

KIND: engine (p2pcast Channel), tcp (TcpChannel) or gloo (torch.distributed all_reduce). A round:
every peer sends an M-byte float32 array to the p receivers of that round's plan (the same seeded
random plan for every transport) and waits until its own send is done and every message addressed to
it has arrived or closed: a barrier, like a BSP training round's communication. gloo all-reduces
the same M bytes instead (every peer gets everyone's sum). Writes the per-round latencies to OUT.
"""
from __future__ import annotations

import json
import random
import sys
import time

import numpy as np


def plan(round: int, world: int, fanout: int, seed: int) -> dict[int, list[int]]:
    """receivers per sender for `round`: p distinct others, drawn the same way on every peer."""
    rng = random.Random(seed * 100_003 + round)
    return {i: rng.sample([j for j in range(world) if j != i], fanout) for i in range(world)}


def run_channel(kind: str, rank: int, cfg: dict) -> list[float]:
    from p2plearn.tolerance import NetworkState, RoundRecord, make_tolerance
    from p2plearn.transport import Channel, TcpChannel

    addrs, world = cfg["addresses"], len(cfg["addresses"])
    ch = (Channel if kind == "engine" else TcpChannel)(host=addrs[rank], port=cfg["port"], sender_id=rank)
    data = np.random.default_rng(rank).random(cfg["bytes"] // 4, dtype=np.float32)
    rate = cfg["rate"] / cfg["fanout"]  # bytes/s per receiver: the uplink shared by the p receivers
    policy = make_tolerance("adaptive") if cfg["bound"] == "adaptive" else None
    network = NetworkState()
    early: dict[int, set[int]] = {}
    latencies = []
    time.sleep(max(0.0, cfg["start_at"] - time.time()))
    for rnd in range(cfg["rounds"]):
        p = plan(rnd, world, cfg["fanout"], cfg["seed"])
        senders = {i for i, rs in p.items() if rank in rs}
        if policy:
            _, deadline = policy.bounds(rnd, [], network, None)  # sets policy.bound from the last round
            bound = policy.bound
        else:
            bound, deadline = float(cfg["bound"]), None
        t0 = time.monotonic()
        handle = ch.send(rnd, [data], [(addrs[j], cfg["port"], rate) for j in p[rank]], loss_bounds=bound, deadline=deadline)
        got = early.pop(rnd, set())
        while not senders <= got:
            d = ch.recv(timeout=30)
            if d is None:
                raise RuntimeError(f"rank {rank}: round {rnd} timed out waiting for {senders - got}")
            (got if d.msg_id == rnd else early.setdefault(d.msg_id, set())).add(d.sender)
        stats = handle.wait()
        latencies.append(time.monotonic() - t0)
        network.history.append(RoundRecord(rnd, latencies[-1], float(np.mean([s.delivered for s in stats])),
                                           float(np.mean([s.loss_rate for s in stats])),
                                           [s.delivery_rate for s in stats], any(s.result == "deadline" for s in stats),
                                           cfg["bytes"]))
    ch.close()
    return latencies


def run_gloo(rank: int, cfg: dict) -> list[float]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{cfg['addresses'][0]}:{cfg['port']}", rank=rank,
                            world_size=len(cfg["addresses"]))
    data = torch.rand(cfg["bytes"] // 4)
    dist.barrier()
    latencies = []
    for _ in range(cfg["rounds"]):
        t0 = time.monotonic()
        dist.all_reduce(data)
        latencies.append(time.monotonic() - t0)
        data /= len(cfg["addresses"])  # keep the values finite
    dist.destroy_process_group()
    return latencies


def main() -> None:
    kind, rank, cfg, out = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    latencies = run_gloo(rank, cfg) if kind == "gloo" else run_channel(kind, rank, cfg)
    with open(out, "w") as f:
        json.dump({"latencies": latencies}, f)


if __name__ == "__main__":
    main()
