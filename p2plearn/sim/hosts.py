"""Where virtual peers run: on hosts of their own (the default, for scale), or several peers sharing
a host's cores (a testbed on one machine: `--colocate CORES [--hosts N]`).

    hosts = Hosts(cores=2, hosts=1)
    stretch = hosts.stretch(n)                        # [n]: each peer's CPU work takes this many times longer
    receive_s = hosts.receive_s(merge_s, nbytes, replica_bytes)  # CPU one received message costs its receiver
    pacing_s = hosts.pacing_s(send_s, received_s)     # [n]: CPU a round's paced flows cost each peer

Peers sharing a host: n peers spread over `hosts` hosts (rank r on host r mod hosts), each host with
`cores` cores. A host's peers compute and receive at about the same time (BSP and SSP rounds keep
them in step), so their CPU work is serialised over its cores: each peer's compute step and receive
work take max(1, peers on its host / cores) times their time on a core of its own. A received
message's work is the engine's (verify the tags, copy into the receive buffer: `engine_s_per_byte`,
measured by `sim.calibrate.engine_cost` for a byte sent and received, which on one host both cost it)
and the merge's (`merge_s`, calibrated per message of the replica's size, scaled to the message's bytes).
A paced send also costs the engines CPU for as long as it lasts, whatever its bytes: the pacer wakes
the sender's engine every few datagrams, and the receiver's engine wakes for each batch that comes
(`pacing_s_per_s`, per second of a send and of each flow received, measured by
`sim.calibrate.pacing_cost` with the testbed's datagrams); a round's pacing costs each co-located peer
its send's duration and its incoming flows' (`pacing_s`), stretched alike, after the merge.
Each round also costs a co-located peer its fixed CPU work (`round_cpu_s`: planning, encoding, the
engine's handshakes, its report and the coordinator's share; `sim.calibrate.round_cost`), stretched
alike, before its send. On hosts of their own a peer's receive work is the merge's only, and its
round's fixed work and its engines' pacing are free (they run beside compute on cores of its own).
Partitioned rounds (`sim.partitioned`) get the compute stretch only.

Not modelled: the order in which a host's peers get their cores (processor sharing, all at once), the
kernel's work on the shaped links (`sim.validate` measures that one as a host rate), memory bandwidth.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Hosts:
    """cores: each host's cores (0: every peer on a host of its own); hosts: how many hosts the peers
    share; engine_s_per_byte: the engine's CPU per message byte (sending and receiving); round_cpu_s:
    a round's fixed CPU work per peer; pacing_s_per_s: the sender's and a receiver's engine CPU per
    second of a paced send, beyond the per-byte work."""

    cores: int = 0
    hosts: int = 1
    engine_s_per_byte: float = 0.0
    round_cpu_s: float = 0.0
    pacing_s_per_s: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self):
        if self.cores < 0 or self.hosts < 1:
            raise ValueError(f"--colocate {self.cores} --hosts {self.hosts}: cores >= 0 and at least one host")

    @property
    def colocated(self) -> bool:
        return self.cores > 0

    def of(self, n: int) -> np.ndarray:
        """Each peer's host."""
        return np.arange(n) % self.hosts if self.colocated else np.arange(n)

    def stretch(self, n: int) -> np.ndarray:
        """[n]: how many times longer each peer's CPU work takes than on a core of its own."""
        if not self.colocated:
            return np.ones(n)
        host = self.of(n)
        return np.maximum(1.0, np.bincount(host, minlength=self.hosts)[host] / self.cores)

    def receive_s(self, merge_s: float, message_bytes: float, replica_bytes: float) -> float:
        """CPU seconds one received message of `message_bytes` costs its receiver on a core of its
        own: its merge (calibrated for a message of `replica_bytes`), and co-located, the engine's."""
        merge = merge_s * message_bytes / replica_bytes if self.colocated else merge_s
        return merge + (self.engine_s_per_byte * message_bytes if self.colocated else 0.0)

    def round_s(self, n: int) -> np.ndarray:
        """[n]: the seconds each peer's round's fixed work takes before its send (0 on hosts of their own)."""
        return self.stretch(n) * (self.round_cpu_s if self.colocated else 0.0)

    def pacing_s(self, send_s: np.ndarray, received_s: np.ndarray) -> np.ndarray:
        """[n]: CPU seconds a round's pacing costs each peer on a core of its own, given how long its
        send lasted (send_s) and the summed durations of the flows it received (received_s); 0 on
        hosts of their own."""
        if not self.colocated:
            return np.zeros(len(send_s))
        sending, receiving = self.pacing_s_per_s
        return sending * np.asarray(send_s) + receiving * np.asarray(received_s)

    def describe(self, n: int) -> str:
        """What a result's `model` field says of where the peers ran."""
        if not self.colocated:
            return "peers on hosts of their own"
        return (f"{n} peers on {self.hosts} host(s) of {self.cores} core(s): compute and receive work (engine "
                f"{self.engine_s_per_byte * 1e9:.2f} ns/byte, merge), a round's fixed work "
                f"({self.round_cpu_s * 1e3:.2f} ms) and pacing ({self.pacing_s_per_s[0]:.3f} s/s sending, "
                f"{self.pacing_s_per_s[1]:.3f} s/s per flow received) stretched x{self.stretch(n).max():g}")
