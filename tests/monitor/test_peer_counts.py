"""A peer's round report carries its counters (the engine's drops by reason): real engines, a real coordinator."""

import secrets
import threading

import numpy as np

from p2plearn.control import Client, Coordinator
from p2plearn.sync import BSP
from p2plearn.tolerance import Layer, make_tolerance
from p2plearn.transport import Channel

from monitor_helpers import wait_for

JOB = "counts-test"


class Reports:
    """A coordinator watcher that keeps each rank's last reported counters."""

    def __init__(self) -> None:
        self.counts: dict[int, dict] = {}

    def observe(self, snapshot) -> None:
        pass

    def published(self, publication) -> None:
        pass

    def reported(self, rank, clock, comm_s, load, counts) -> None:
        self.counts[rank] = counts


def test_reports_carry_the_engines_drops():
    key = secrets.token_hex(16)
    coordinator = Coordinator(JOB, key, heartbeat=0.2, startup_grace=1.0)
    coordinator.watcher = reports = Reports()
    coordinator.start()
    channels, clients, syncs = [], [], []
    try:
        for rank in range(2):
            # every fifth data datagram dropped on arrival: retransmitted, and counted as drop_injected
            channels.append(Channel(sender_id=rank, drop_prob=0.2, seed=rank + 1))
            clients.append(Client(coordinator.address, JOB, key, rank=rank, connect_timeout=5.0))
            clients[-1].register(channels[-1].address)
        for client in clients:
            client.wait_members(2, 5.0, receiving=True)
        for rank in range(2):
            params = [np.full(200_000, float(rank), np.float32)]
            syncs.append(BSP(params, [Layer("p", params[0].size, params[0].nbytes, 0)], channels[rank], clients[rank],
                             selection="all", fanout=1, seed=0, tolerance=make_tolerance("fixed")))
        errors = []

        def rounds(sync):
            try:
                for _ in range(3):
                    sync.step()
            except Exception as exc:  # reported to the test
                errors.append(exc)

        threads = [threading.Thread(target=rounds, args=(s,)) for s in syncs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        # reports are one-way: the last ones may still be on their way
        wait_for(lambda: all(reports.counts.get(r, {}).get("drop_injected") for r in range(2)), 5, "both reports")
        for rank in range(2):
            dropped = channels[rank].stats()["drop_injected"]
            assert dropped > 0
            # the last report was sent after the last round's receive: its count is at most the engine's now
            assert 0 < reports.counts[rank]["drop_injected"] <= dropped
            assert set(reports.counts[rank]) <= {"deadline", "slow"} | {k for k in channels[rank].stats() if k.startswith("drop_")}
    finally:
        for client in clients:
            client.close()
        for channel in channels:
            channel.close()
        coordinator.stop()
