"""What selection sees of the network: per peer available uplink/downlink and message size."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

# Senders pace at this fraction of the planned share: the rest of each link carries the reverse
# traffic (ACKs, probes) and absorbs timing jitter, so shaped queues drain instead of overflowing.
# At 1.0 the paced flows fill a link exactly, any extra byte queues, and a shallow switch buffer drops.
PACING_HEADROOM = 0.95
# The planner refuses start times and merge costs above this (native/planner.c MAX_SECONDS): a view
# caps its loads here, so that one member reporting an absurd load is planned as very late, rather
# than making every peer's plan fail.
MAX_LOAD_S = 1e6

# Wire bytes per message byte on a 1500-byte MTU path: the engine's datagram carries 1416 bytes of
# data behind a 56-byte header, plus 42 of IPv4 + UDP + Ethernet. Rates in a view are wire bytes/s
# (links, pacing and the estimator count frames), so a view made from the control plane's counts a
# message in wire bytes too; on paths with larger datagrams (loopback) it overstates by up to 7%.
DATAGRAM_DATA, DATAGRAM_WIRE = 1416, 1416 + 56 + 42
FRAMING = DATAGRAM_WIRE / DATAGRAM_DATA


# Probing: planning and pacing an end above its estimate, so that a link that recovered from a
# drop is found again (a sample never exceeds what was offered, and a peer too slow to be given a
# message is not measured at all). Each peer's ends are probed in one round of every PROBE_EVERY
# (offset by rank, so that probes spread over rounds), at the estimator's target for them, at most
# MAX_PROBE_GAIN times the estimate. Tuning: a smaller PROBE_EVERY finds a recovered link sooner,
# at more cost on links that stay slow (a probe round plans such a link at more than it carries:
# its flows take up to the gain times longer); MAX_PROBE_GAIN bounds that cost per probe.
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
    uplink_target, downlink_target: the rate each end's next probe offers (see `probed`); None =
        no probes.
    probing_up, probing_down: the ends this view probes (set by `probed`); None = none.
    merge_cost: seconds a peer's CPU takes to merge one received message (it merges them one after
        another from its up_start); None = merging is free.
    mcast_domain: IP multicast domain per peer: peers with the same value >= 0 reach each other
        with one copy on the sender's uplink (a group), -1 = unicast only; None = unicast everywhere.
    """

    uplink: np.ndarray
    downlink: np.ndarray
    message_bytes: np.ndarray
    alive: np.ndarray
    up_start: np.ndarray | None = None
    down_start: np.ndarray | None = None
    uplink_target: np.ndarray | None = None
    downlink_target: np.ndarray | None = None
    probing_up: np.ndarray | None = None
    probing_down: np.ndarray | None = None
    merge_cost: np.ndarray | None = None
    mcast_domain: np.ndarray | None = None

    def __post_init__(self) -> None:
        for name in ("up_start", "down_start"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros(len(self.uplink)))
        if self.mcast_domain is not None:
            object.__setattr__(self, "mcast_domain", domain_ids(self.mcast_domain))

    @property
    def n(self) -> int:
        return len(self.uplink)

    @classmethod
    def uniform(cls, n: int, rate: float, message_bytes: float) -> "NetworkView":
        ones = np.ones(n)
        return cls(ones * rate, ones * rate, ones * message_bytes, np.ones(n, dtype=bool))

    def probed(self, round: int) -> "NetworkView":
        """The view that plans and paces round `round`: the ends `probe_gains` picks for it raised
        so that their flows, paced at PACING_HEADROOM of their share of it, offer gain x the
        estimate (see `plan_flows`), and marked as probing."""
        if self.uplink_target is None or self.downlink_target is None:
            return self
        up = probe_gains(self.uplink, self.uplink_target, round)
        down = probe_gains(self.downlink, self.downlink_target, round)
        if (up == 1).all() and (down == 1).all():
            return self
        return replace(self, uplink=np.where(up > 1, up * self.uplink / PACING_HEADROOM, self.uplink),
                       downlink=np.where(down > 1, down * self.downlink / PACING_HEADROOM, self.downlink),
                       probing_up=up > 1, probing_down=down > 1)

    @classmethod
    def from_global(cls, view, message_bytes) -> "NetworkView":
        """From the control plane's GlobalView and this round's sizes; load enters as start times:

        - up_start[i] = compute_s[i] + backlog[i] * merge_s[i]: a peer sends once it has computed
          its step and merged the messages waiting for it (its CPU comes first);
        - down_start[j] = max(in_flight_bytes[j] / downlink[j], min over live i of up_start[i]):
          a downlink first drains what is still arriving, and takes nothing of this round before
          the first sender starts;
        - merge_cost[j] = merge_s[j]: each message a peer receives costs its CPU that long, after
          its up_start (a slow computer can merge fewer messages by T, so it gets fewer senders).
        The view's multicast domains (`mcast_domain`, if it has them) are copied as they are.

        Units: rates are wire bytes/s, so message sizes (bytes of data) become wire bytes (x FRAMING)
        and loads seconds; a plan's T is then in seconds on the wire.
        """
        up = np.asarray(view.uplink, dtype=float)
        down = np.asarray(view.downlink, dtype=float)
        alive = np.asarray(view.alive, dtype=bool)
        merge = np.minimum(np.asarray(view.merge_s, float), MAX_LOAD_S)
        up_start = np.minimum(np.asarray(view.compute_s, float) + np.asarray(view.backlog, float) * merge, MAX_LOAD_S)
        first = up_start[alive].min(initial=np.inf) if alive.any() else 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            drain = np.where(down > 0, np.asarray(view.in_flight_bytes, float) / down, 0.0)
        sizes = np.broadcast_to(np.asarray(message_bytes, dtype=float), up.shape) * FRAMING
        return cls(up, down, sizes, alive, up_start, np.minimum(np.maximum(drain, first), MAX_LOAD_S),
                   np.asarray(view.uplink_target, float), np.asarray(view.downlink_target, float),
                   merge_cost=merge, mcast_domain=getattr(view, "mcast_domain", None))


def domain_ids(values) -> np.ndarray:
    """Multicast domains as the planner takes them (int32), refusing what a cast would change: a
    value that is not a whole number, or outside [-1, 2**31 - 1], would merge domains silently
    (2**40 and 0.5 both become 0). ValueError names the first such peer."""
    given = np.asarray(values)
    if given.dtype.kind not in "iuf":
        raise ValueError(f"mcast_domain must be numbers, got dtype {given.dtype}")
    wrong = ~((given == np.round(given)) & (given >= -1) & (given <= 2**31 - 1))  # NaN fails the first
    if wrong.any():
        peer = int(np.flatnonzero(wrong)[0])
        raise ValueError(f"mcast_domain[{peer}] = {given[peer].item()!r}: must be a whole number from 0 to {2**31 - 1}, "
                         "or -1 for none")
    return given.astype(np.int32)


def multicast_domains(view: NetworkView, ip_multicast: bool = False) -> np.ndarray | None:
    """Each peer's multicast domain (see NetworkView.mcast_domain): all one domain when
    `ip_multicast` (the network replicates for everyone), else the view's own, or None."""
    if ip_multicast:
        return np.zeros(view.n, dtype=np.int32)
    return view.mcast_domain


def _in_group(view: NetworkView, src: np.ndarray, dst: np.ndarray, ip_multicast: bool) -> np.ndarray:
    """Per flow: whether its receiver is in its sender's multicast domain (reached by the group)."""
    domain = multicast_domains(view, ip_multicast)
    if domain is None:
        return np.zeros(len(src), dtype=bool)
    return (domain[src] >= 0) & (domain[src] == domain[dst])


def _flows(plan: dict[int, list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) per flow of `plan`, senders as listed, receivers as listed."""
    fanout = np.array([len(rs) for rs in plan.values()], dtype=np.int64)
    src = np.repeat(np.fromiter(plan.keys(), dtype=np.int64, count=len(plan)), fanout)
    dst = np.fromiter((j for rs in plan.values() for j in rs), dtype=np.int64, count=int(fanout.sum()))
    return src, dst


def uplink_copies(n: int, src: np.ndarray, in_group: np.ndarray) -> np.ndarray:
    """Copies of its message each sender's uplink carries: one per receiver outside its group, and
    one for the group if any receiver is in it."""
    outside = np.bincount(src[~in_group], minlength=n)
    return outside + (np.bincount(src[in_group], minlength=n) > 0)


def plan_time(view: NetworkView, plan: dict[int, list[int]], ip_multicast: bool = False) -> float:
    """T(plan), seconds: the latest end of any uplink's, downlink's or merge's work, start + load /
    capacity.

    Sender i's uplink carries M_i per copy (`uplink_copies`: one per receiver, except one for all
    receivers in its multicast domain; `ip_multicast`: everyone is in one domain). Receiver j's
    downlink carries the sum of M_i over the senders that chose j, and its CPU merges them in
    up_start[j] + senders x merge_cost[j].
    """
    src, dst = _flows(plan)
    size = np.asarray(view.message_bytes, float)
    up_load = uplink_copies(view.n, src, _in_group(view, src, dst, ip_multicast)) * size
    down_load = np.bincount(dst, weights=size[src], minlength=view.n)
    senders = np.bincount(dst, minlength=view.n)
    merge = np.zeros(view.n) if view.merge_cost is None else np.asarray(view.merge_cost, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_up = np.where(up_load > 0, view.up_start + up_load / view.uplink, 0.0)
        t_down = np.where(down_load > 0, view.down_start + down_load / view.downlink, 0.0)
    t_merge = np.where(senders > 0, view.up_start + senders * merge, 0.0)
    return float(max(t_up.max(initial=0.0), t_down.max(initial=0.0), t_merge.max(initial=0.0)))


def average_fanout(plan: dict[int, list[int]]) -> float:
    """Average p: receivers per sender, over the senders in the plan."""
    return float(np.mean([len(r) for r in plan.values()])) if plan else 0.0


def probe_gains(rate: np.ndarray, target: np.ndarray, round: int) -> np.ndarray:
    """Per peer, how far above its estimate `rate` an end is probed in `round` (1: not probed): the
    ends of one peer in PROBE_EVERY rounds, by rank, at target / rate, at most MAX_PROBE_GAIN; an
    end whose target lies within the pacing headroom of its estimate is not probed."""
    gain = np.ones(len(rate))
    due = (round + np.arange(len(rate))) % PROBE_EVERY == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.minimum(np.asarray(target, float) / rate, MAX_PROBE_GAIN)
    probe = due & (room * PACING_HEADROOM > 1.0)
    gain[probe] = room[probe]
    return gain


def flow_probes(view: NetworkView, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per flow: whether it probes its sender's uplink, and whether it probes its receiver's
    downlink, in `view` (a `probed` one); the estimator puts a probe's limit on the end it probed."""
    none = np.zeros(len(src), dtype=bool)
    return (none if view.probing_up is None else view.probing_up[src],
            none if view.probing_down is None else view.probing_down[dst])


def plan_flows(view: NetworkView, plan: dict[int, list[int]],
               ip_multicast: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, rate) per flow of `plan`, in plan order (senders as listed, receivers as listed).

    rate = PACING_HEADROOM * min(D_j M_i / L_j, U_i / |R_i|) bytes/s, L_j = the bytes j receives: the
    receiver's downlink shared by the senders that chose it in proportion to their message sizes
    (equal shares when sizes are equal), capped by the sender's uplink share. Then every flow takes
    max(L_j / D_j, |R_i| M_i / U_i) <= T(plan), the planner's model, also with unequal sizes (an
    equal split made the larger messages finish up to 3.6x later). The coordinator paces each send
    this way and the simulator models it. With IP multicast (`ip_multicast`, or receivers in the
    sender's `mcast_domain`) the sender's uplink carries one copy for its group: |R_i| above counts
    copies (`uplink_copies`), and the group's flows go at its slowest receiver's rate.

    A probed end (`view.probed(round)`) offers what it is probed at whatever the other end's share:
    its flows run at their share of it, capped by the other end's whole rate only (a downlink's few
    senders could not offer its target at their uplink shares). The other end may then carry more
    than its rate while the probe lasts: its other flows keep their paces (slowing them to make
    room would stretch them for the whole send: pacing rates are fixed per send) and end later by
    at most the probe's extra bytes over its rate.
    """
    src, dst = _flows(plan)
    size = np.asarray(view.message_bytes, float)[src]
    received = np.bincount(dst, weights=size, minlength=view.n)
    in_group = _in_group(view, src, dst, ip_multicast)
    down_share = np.asarray(view.downlink, float)[dst] * size / received[dst]
    up_share = np.asarray(view.uplink, float)[src] / uplink_copies(view.n, src, in_group)[src]
    rate = np.minimum(down_share, up_share)
    if view.probing_up is not None and view.probing_down is not None:
        rate = _with_probes(view, src, dst, rate, down_share, up_share)
    if in_group.any():  # one copy per group: it goes at its slowest receiver's rate
        slowest = np.full(view.n, np.inf)
        np.minimum.at(slowest, src[in_group], rate[in_group])
        rate = np.where(in_group, slowest[src], rate)
    return src, dst, rate * PACING_HEADROOM


def _with_probes(view: NetworkView, src: np.ndarray, dst: np.ndarray, rate: np.ndarray, down_share: np.ndarray,
                 up_share: np.ndarray) -> np.ndarray:
    """plan_flows' rates with the probed ends' flows at their share of the probed end."""
    up, down = np.asarray(view.uplink, float), np.asarray(view.downlink, float)
    rate = np.where(view.probing_down[dst], np.maximum(rate, np.minimum(down_share, up[src])), rate)
    return np.where(view.probing_up[src], np.maximum(rate, np.minimum(up_share, down[dst])), rate)
