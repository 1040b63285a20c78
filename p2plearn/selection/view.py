"""What selection sees of the network: per peer available uplink/downlink and message size."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Senders pace at this fraction of the planned share: the rest of each link carries the reverse
# traffic (ACKs, probes) and absorbs timing jitter, so shaped queues drain instead of overflowing.
# At 1.0 the paced flows fill a link exactly, any extra byte queues, and a shallow switch buffer drops.
PACING_HEADROOM = 0.95


# Probing: pacing above the estimate, so that a link that recovered from a drop is found again (a
# sample never exceeds what was offered). Each peer's ends are probed in one round of every
# PROBE_EVERY (offset by rank, so that probes spread over rounds), at up to MAX_PROBE_GAIN times
# the estimate, towards the end's ceiling (its line rate). Tuning: a smaller PROBE_EVERY finds a
# recovered link sooner, at more loss on links that stay slow; MAX_PROBE_GAIN bounds that loss
# (a probe on a link still at a quarter of its ceiling offers it 4x what it carries, once).
PROBE_EVERY = 3
MAX_PROBE_GAIN = 4.0


@dataclass(frozen=True)
class NetworkView:
    """Arrays indexed by peer (rank). Rates in wire bytes/s, sizes in bytes, times in seconds.

    uplink, downlink: available bandwidth (bytes/s).
    message_bytes: size of the message each peer sends this round (M_i).
    alive: peers that take part; dead ones neither send nor receive.
    up_start, down_start: when, from the start of the round, a peer's uplink can start sending
        (after its compute) and its downlink can start taking this round's messages (after
        what is still arriving); None = 0 (the round's links are free from its start).
    uplink_ceiling, downlink_ceiling: the rates probes look for (line rates); None = no probes.
    """

    uplink: np.ndarray
    downlink: np.ndarray
    message_bytes: np.ndarray
    alive: np.ndarray
    up_start: np.ndarray | None = None
    down_start: np.ndarray | None = None
    uplink_ceiling: np.ndarray | None = None
    downlink_ceiling: np.ndarray | None = None

    def __post_init__(self) -> None:
        for name in ("up_start", "down_start"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros(len(self.uplink)))

    @property
    def n(self) -> int:
        return len(self.uplink)

    @classmethod
    def uniform(cls, n: int, rate: float, message_bytes: float) -> "NetworkView":
        ones = np.ones(n)
        return cls(ones * rate, ones * rate, ones * message_bytes, np.ones(n, dtype=bool))

    @classmethod
    def from_global(cls, view, message_bytes) -> "NetworkView":
        """From the control plane's GlobalView and this round's sizes; load enters as start times:

        - up_start[i] = compute_s[i] + backlog[i] * merge_s[i]: a peer sends once it has computed
          its step and merged the messages waiting for it (its CPU comes first);
        - down_start[j] = max(in_flight_bytes[j] / downlink[j], min over live i of up_start[i]):
          a downlink first drains what is still arriving, and takes nothing of this round before
          the first sender starts.
        """
        up = np.asarray(view.uplink, dtype=float)
        down = np.asarray(view.downlink, dtype=float)
        alive = np.asarray(view.alive, dtype=bool)
        up_start = np.asarray(view.compute_s, float) + np.asarray(view.backlog, float) * np.asarray(view.merge_s, float)
        first = up_start[alive].min(initial=np.inf) if alive.any() else 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            drain = np.where(down > 0, np.asarray(view.in_flight_bytes, float) / down, 0.0)
        sizes = np.broadcast_to(np.asarray(message_bytes, dtype=float), up.shape).copy()
        return cls(up, down, sizes, alive, up_start, np.maximum(drain, first),
                   np.asarray(view.uplink_ceiling, float), np.asarray(view.downlink_ceiling, float))


def plan_time(view: NetworkView, plan: dict[int, list[int]], ip_multicast: bool = False) -> float:
    """T(plan), seconds: the latest end of any uplink's or downlink's work, start + load / capacity.

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
        t_up = np.where(up_load > 0, view.up_start + up_load / view.uplink, 0.0)
        t_down = np.where(down_load > 0, view.down_start + down_load / view.downlink, 0.0)
    return float(max(t_up.max(initial=0.0), t_down.max(initial=0.0)))


def average_fanout(plan: dict[int, list[int]]) -> float:
    """Average p: receivers per sender, over the senders in the plan."""
    return float(np.mean([len(r) for r in plan.values()])) if plan else 0.0


def probe_gains(rate: np.ndarray, ceiling: np.ndarray | None, round: int) -> np.ndarray:
    """Per peer, how far above its estimate `rate` an end is paced in `round` (1: not probed): the
    ends of one peer in PROBE_EVERY, by rank, up to MAX_PROBE_GAIN and no further than the ceiling;
    an end within the pacing headroom of its ceiling is not probed."""
    gain = np.ones(len(rate))
    if ceiling is None:
        return gain
    due = (round + np.arange(len(rate))) % PROBE_EVERY == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.minimum(np.asarray(ceiling, float) / rate, MAX_PROBE_GAIN)
    probe = due & (room * PACING_HEADROOM > 1.0)
    gain[probe] = room[probe]
    return gain


def plan_flows(view: NetworkView, plan: dict[int, list[int]],
               probe_round: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, rate) per flow of `plan`, in plan order (senders as listed, receivers as listed).

    rate = PACING_HEADROOM * min(D_j M_i / L_j, U_i / |R_i|) bytes/s, L_j = the bytes j receives: the
    receiver's downlink shared by the senders that chose it in proportion to their message sizes
    (equal shares when sizes are equal), capped by the sender's uplink share. Then every flow takes
    max(L_j / D_j, |R_i| M_i / U_i) <= T(plan), the planner's model, also with unequal sizes (an
    equal split made the larger messages finish up to 3.6x later). The coordinator paces each send
    this way and the simulator models it.

    With `probe_round`, the ends `probe_gains` picks for that round are probed: a probed downlink's
    flows run at its gain times their downlink share (so together they offer gain * D_j), a probed
    uplink's at its gain times their uplink share, whatever the other end's share; a flow may
    then end sooner than planned, never later unless the probe finds a link still slow.
    """
    fanout = np.array([len(rs) for rs in plan.values()], dtype=np.int64)
    src = np.repeat(np.fromiter(plan.keys(), dtype=np.int64, count=len(plan)), fanout)
    dst = np.fromiter((j for rs in plan.values() for j in rs), dtype=np.int64, count=int(fanout.sum()))
    size = np.asarray(view.message_bytes, float)[src]
    received = np.bincount(dst, weights=size, minlength=view.n)
    outdegree = np.bincount(src, minlength=view.n)
    down_share = np.asarray(view.downlink, float)[dst] * size / received[dst]
    up_share = np.asarray(view.uplink, float)[src] / outdegree[src]
    rate = np.minimum(down_share, up_share) * PACING_HEADROOM
    if probe_round is not None:
        down_gain = probe_gains(view.downlink, view.downlink_ceiling, probe_round)[dst]
        up_gain = probe_gains(view.uplink, view.uplink_ceiling, probe_round)[src]
        rate = np.maximum(rate, np.maximum(np.where(down_gain > 1, down_gain * down_share, 0.0),
                                           np.where(up_gain > 1, up_gain * up_share, 0.0)))
    return src, dst, rate
