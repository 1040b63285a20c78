"""The network of `p2plearn.sim.tracking` on the root testbed: real engines, tbf-shaped links.

`TestbedNetwork(peers, mbit, bursts, rounds, message_bytes)` builds a homogeneous topology as a
Testbed with one `p2plearn.sim.peer` per namespace (see `p2plearn.sim.validate.testbed_peers`).
Each round it applies the bursts that start or end then (`Testbed.set_rate`, between rounds:
every peer's report of the last round is in), has every peer send its flows at their paces, and
returns each flow's ACK-based rate as the sender's engine measured it.
"""
from __future__ import annotations

from contextlib import ExitStack

import numpy as np

from p2plearn.sim.tracking import Burst
from p2plearn.sim.validate import run_round, testbed_peers
from p2plearn.topology.generators import homogeneous


class TestbedNetwork:
    """A context manager; call it like `tracking.FlowNetwork` (root only)."""

    def __init__(self, peers: int, mbit: float, bursts: list[Burst], rounds: int, message_bytes: int):
        self.n, self.mbit, self.bursts = peers, mbit, bursts
        self.rounds, self.message_bytes = rounds, message_bytes
        self._stack = ExitStack()

    def __enter__(self) -> TestbedNetwork:
        topology = homogeneous(self.n, self.mbit)
        self.testbed, self.peers = self._stack.enter_context(
            testbed_peers(topology, "selmcast", 1, self.message_bytes, self.rounds))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.__exit__(*exc)  # on failure the peers are stopped, not waited for

    def __call__(self, rnd: int, src: np.ndarray, dst: np.ndarray, pace: np.ndarray, size: float) -> np.ndarray:
        for b in self.bursts:
            if rnd in (b.start, b.end):
                mbit = self.mbit * (b.factor if rnd == b.start else 1.0)
                self.testbed.set_rate(b.peer, **{"up_mbit" if b.uplink else "down_mbit": mbit})
        commands = []
        for i in range(self.n):
            mine = src == i
            flows = ",".join(f"{j}:{r:.0f}" for j, r in zip(dst[mine], pace[mine])) or "-"
            commands.append(f"send {rnd} {int(size)} {int(np.count_nonzero(dst == i))} {flows}")
        measured = {(i, f["to"]): f["ack_rate"] for i, report in enumerate(run_round(self.peers, commands))
                    for f in report["flows"]}
        return np.array([measured[(i, j)] for i, j in zip(src.tolist(), dst.tolist())])
