"""What selection sees of the network: per peer available uplink/downlink and message size."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Senders pace at this fraction of the planned share: the rest of each link carries the reverse
# traffic (ACKs, probes) and absorbs timing jitter, so shaped queues drain instead of overflowing.
# At 1.0 the paced flows fill a link exactly, any extra byte queues, and a shallow switch buffer drops.
PACING_HEADROOM = 0.95


@dataclass(frozen=True)
class NetworkView:
    """Arrays indexed by peer (rank).

    uplink, downlink: available bandwidth in bytes/s (after subtracting current load).
    message_bytes: size of the message each peer sends this round (M_i).
    alive: peers that take part; dead ones neither send nor receive.
    """

    uplink: np.ndarray
    downlink: np.ndarray
    message_bytes: np.ndarray
    alive: np.ndarray

    @property
    def n(self) -> int:
        return len(self.uplink)

    @classmethod
    def uniform(cls, n: int, rate: float, message_bytes: float) -> "NetworkView":
        ones = np.ones(n)
        return cls(ones * rate, ones * rate, ones * message_bytes, np.ones(n, dtype=bool))

    @classmethod
    def from_global(cls, view, message_bytes) -> "NetworkView":
        """From the control plane's GlobalView (uplink, downlink, load, alive) and this round's sizes.

        The load (bytes in flight towards a peer) is subtracted from its downlink as the bandwidth
        that it will take over the next second; a floor keeps every live peer selectable.
        """
        up = np.asarray(view.uplink, dtype=float)
        down = np.asarray(view.downlink, dtype=float)
        down = np.maximum(down - np.asarray(view.load, dtype=float), 0.05 * down)
        sizes = np.broadcast_to(np.asarray(message_bytes, dtype=float), up.shape).copy()
        return cls(up, down, sizes, np.asarray(view.alive, dtype=bool))


def plan_time(view: NetworkView, plan: dict[int, list[int]], ip_multicast: bool = False) -> float:
    """T(plan): the largest uplink or downlink load divided by its capacity, in seconds.

    Application-level multicast: sender i's uplink carries |R_i| M_i; with IP multicast one M_i.
    Receiver j's downlink carries the sum of M_i over the senders that chose j.
    """
    up_load = np.zeros(view.n)
    down_load = np.zeros(view.n)
    for i, rs in plan.items():
        if not rs:
            continue
        up_load[i] += view.message_bytes[i] * (1 if ip_multicast else len(rs))
        for j in rs:
            down_load[j] += view.message_bytes[i]
    with np.errstate(divide="ignore", invalid="ignore"):
        t_up = np.where(up_load > 0, up_load / view.uplink, 0.0)
        t_down = np.where(down_load > 0, down_load / view.downlink, 0.0)
    return float(max(t_up.max(initial=0.0), t_down.max(initial=0.0)))


def average_fanout(plan: dict[int, list[int]]) -> float:
    """Average p: receivers per sender, over the senders in the plan."""
    return float(np.mean([len(r) for r in plan.values()])) if plan else 0.0


def plan_flows(view: NetworkView, plan: dict[int, list[int]],
               ip_multicast: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, rate) per flow of `plan`, in plan order (senders as listed, receivers as listed).

    rate = PACING_HEADROOM * min(D_j M_i / L_j, U_i / |R_i|) bytes/s, L_j = the bytes j receives: the
    receiver's downlink shared by the senders that chose it in proportion to their message sizes
    (equal shares when sizes are equal), capped by the sender's uplink share. Then every flow takes
    max(L_j / D_j, |R_i| M_i / U_i) <= T(plan), the planner's model, also with unequal sizes (an
    equal split made the larger messages finish up to 3.6x later). The coordinator paces each send
    this way and the simulator models it. With IP multicast the sender's uplink carries one copy for
    all its receivers: its share is U_i, and the group goes at its slowest receiver's rate.
    """
    fanout = np.array([len(rs) for rs in plan.values()], dtype=np.int64)
    src = np.repeat(np.fromiter(plan.keys(), dtype=np.int64, count=len(plan)), fanout)
    dst = np.fromiter((j for rs in plan.values() for j in rs), dtype=np.int64, count=int(fanout.sum()))
    size = np.asarray(view.message_bytes, float)[src]
    received = np.bincount(dst, weights=size, minlength=view.n)
    outdegree = np.bincount(src, minlength=view.n)
    rate = np.minimum(np.asarray(view.downlink, float)[dst] * size / received[dst],
                      np.asarray(view.uplink, float)[src] / (1 if ip_multicast else outdegree[src]))
    return src, dst, rate * PACING_HEADROOM
