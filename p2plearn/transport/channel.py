"""`Channel`: the Python face of the p2pcast engine (one per peer).

    with Channel(host="127.0.0.1", sender_id=rank) as ch:
        h = ch.send(round, [w1, b1, w2], receivers=[("10.0.0.2", 7000, 12.5e6)], loss_bounds=0.05)
        d = ch.recv(timeout=1.0)          # Delivery(sender, msg_id, arrays, mask, ...)
        ch.fill(d, "own", own=[w1, b1, w2])
        h.wait()                          # per-receiver stats

Arrays (numpy, or contiguous CPU torch tensors) are read in place by the engine's I/O thread:
do not change them until the send's `wait()` returns.
"""
from __future__ import annotations

import ipaddress
import itertools
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from p2plearn.keys import job_tag
from p2plearn.transport._native import TransportError, check, ffi, lib
from p2plearn.transport.arrays import EngineMemory, as_numpy, decode_descriptor, encode_descriptor
from p2plearn.transport.delivery import Delivery, Reason
from p2plearn.transport.send import ReceiverStats, SendHandle, _receiver_tuple

# What other modules import from here (ReceiverStats and SendHandle are send.py's).
__all__ = ["Channel", "ReceiverStats", "SendHandle", "CHUNK_CLAIM", "ANSWER_LINGER_S", "TRANSPORT_MODES", "PROBE_MSG_IDS"]

KEY_BYTES = 32  # the data key: AES-256 (native/auth.h)
# An incoming message claims whole chunks: memory for up to this many bytes more than it holds.
CHUNK_CLAIM = lib.P2P_MAX_CHUNK
# At the end of a job: how long an engine goes on answering peers still sending to it, longer than
# the 3 s of silence after which a sender gives its receiver up (native/txr.c, UNREACHABLE_NS). A
# receiver whose acknowledgements were lost is asked again; stopped at once, it would fail that send.
ANSWER_LINGER_S = 5.0
TRANSPORT_MODES = ("unicast", "multicast", "auto")
# probe_multicast's messages carry this in place of an array descriptor (recv never returns them),
# under ids of their own, two fresh ones per probe (a receiver refuses an id it delivered from this
# sender in the last 30 s, and a peer may probe an engine again: it restarted, or joined late).
PROBE_DESCRIPTOR = b"p2plearn:multicast-probe"
PROBE_MSG_IDS = range(0xFFFFFF00, 0xFFFFFFFF)


class Channel:
    """One peer's engine: a UDP socket and an I/O thread that send and receive whole messages.

    Args (tuning):
        host, port: where to bind (IPv4); port 0 picks a free one (see `address`).
        sender_id: this peer's id (its rank); receivers see it as `Delivery.sender`.
        job_id, key: the job's id (its text: the launcher's job id) and its data key (32 bytes,
            ``p2plearn.keys.data_key(secret, job_id)``). Datagrams carry a hash of the job id and an
            AES-256-GMAC tag under the key over the datagram and its destination (the receiver's
            address and port as the sender addressed it, or the multicast group): another job's
            datagrams, a datagram sent to another receiver, and any datagram received before are
            dropped and counted. key=None turns tags off (no authentication; jobs stay apart).
        max_datagram: UDP payload per datagram; None = from each path's MTU (1472 on 1500-byte
            links, ~64 KiB on loopback). Lower it if a path has a smaller MTU than its interface.
        window_bytes: unacknowledged bytes in flight per receiver. Raise on long fat paths; lower if
            receivers overflow their socket buffer (shows as loss without a shaped link).
        rx_idle: seconds without a datagram after which a partial message is handed over as EXPIRED.
        max_message_bytes: largest incoming message accepted; a larger one is refused, counted as
            ``drop_too_large``. It bounds what a key holder can make this peer allocate: set it to
            the largest message the job sends (`p2plearn.transport.message_bytes` of its arrays).
        max_partial_messages, max_partial_per_source, max_partial_bytes: quotas on incoming
            messages still being received (all sources; one address and port; the bytes they
            claim together, each up to CHUNK_CLAIM more than its bytes; None = 4 messages of
            max_message_bytes). A new message that would exceed one drops the oldest partial
            message (that source's first), counted as ``drop_evicted``. Size max_partial_bytes for
            what arrives at once: a few messages from each peer that sends to this one (every
            member, at the end of a job's final average).
        max_queued_messages, max_queued_bytes: quotas on delivered messages waiting for `recv`
            (all sources together; the bytes they claim, as above; None = the same as
            max_partial_messages and max_partial_bytes). A newly delivered message that would
            exceed one drops the oldest waiting message of the source (address and port) holding
            the most, counted as ``drop_queue_full``: a source never loses a message to another
            that holds less than it, so a key holder's flood of messages between two `recv` calls
            drops its own. ``queued_messages`` and ``queued_bytes`` in `stats` say what waits now.
        uplink_rate: bytes/s this peer may send in total (its uplink); 0 = unpaced. Per-receiver
            rates are given with each send.
        drop_prob, seed: drop incoming data datagrams with this probability (loss injection for
            tests and emulation without root).
        socket_buffer: SO_SNDBUF/SO_RCVBUF in bytes (forced beyond the sysctl limit when root).
        gso: use UDP GSO/GRO segmentation offload when the kernel has it.
        transport_mode: how sends reach receivers by default. "unicast": one copy per receiver on
            the uplink. "multicast": one copy to this sender's IP multicast group for all of them
            (a LAN or cluster switch replicates it), falling back to unicast per receiver that the
            group does not reach (costs a few round trips of that message). "auto": multicast to
            the receivers `probe_multicast` found reachable, unicast to the rest (training rounds
            say per receiver instead, from the view's multicast domains: see `send`).
        mcast_port: the port every peer of the job receives multicast data on (the same on all;
            several engines of one host share it); needed by "multicast" and "auto", and by a
            receiver to take multicast at all (0 = off: it answers every sender "unicast").
        mcast_groups: the job's group range, "base/prefix"; sender i uses base + i mod its size.
            One group per sender (a /16 for up to 65536 ranks) keeps each receiver's downlink to
            the senders it joined; a smaller range works but shares groups (more downlink).
        mcast_ttl: router hops a multicast datagram may cross (1: this LAN).
        mcast_max_joined: groups joined at once; a receiver with more senders at once gets the
            rest by unicast. Keep it under the kernel's net.ipv4.igmp_max_memberships (20).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, sender_id: int = 0, job_id: str | int = "",
                 key: bytes | None = None, max_datagram: int | None = None, window_bytes: int = 8 << 20,
                 rx_idle: float = 5.0, max_message_bytes: int = 4 << 30, max_partial_messages: int = 1024,
                 max_partial_per_source: int = 64, max_partial_bytes: int | None = None,
                 max_queued_messages: int | None = None, max_queued_bytes: int | None = None, uplink_rate: float = 0.0,
                 drop_prob: float = 0.0, seed: int = 0, socket_buffer: int = 32 << 20, gso: bool = True,
                 transport_mode: str = "unicast", mcast_port: int = 0, mcast_groups: str = "239.77.0.0/16",
                 mcast_ttl: int = 1, mcast_max_joined: int = 16):
        if not 0 <= sender_id < 65536:
            raise ValueError(f"sender_id must be in 0..65535, got {sender_id}")
        if transport_mode not in TRANSPORT_MODES:
            raise ValueError(f"transport_mode must be one of {', '.join(TRANSPORT_MODES)}, got {transport_mode!r}")
        if transport_mode != "unicast" and not mcast_port:
            raise ValueError(f"transport_mode {transport_mode!r} needs an mcast_port")
        if not 0 <= mcast_port < 65536 or not 1 <= mcast_ttl <= 255:
            raise ValueError(f"mcast_port must be in 0..65535 and mcast_ttl in 1..255, got {mcast_port}, {mcast_ttl}")
        groups = ipaddress.ip_network(mcast_groups)
        if not groups.is_multicast:
            raise ValueError(f"mcast_groups must be a multicast range (in 224.0.0.0/4), got {mcast_groups!r}")
        if key is not None and len(key) != KEY_BYTES:
            raise ValueError(f"key must be {KEY_BYTES} bytes, got {len(key)}")
        cfg = ffi.new("p2p_config *")
        lib.p2p_config_default(cfg)
        host_c = ffi.new("char[]", socket.gethostbyname(host).encode())
        cfg.host = host_c
        cfg.port = port
        cfg.sender_id = sender_id
        cfg.job_id = job_tag(str(job_id))
        if key:
            ffi.memmove(cfg.key, key, KEY_BYTES)
        cfg.max_datagram = max_datagram or 0
        cfg.window_bytes = window_bytes
        cfg.rx_idle_ms = max(1, int(rx_idle * 1000))
        cfg.max_message_bytes = max_message_bytes
        cfg.max_partial_messages = max_partial_messages
        cfg.max_partial_per_source = max_partial_per_source
        if max_partial_bytes is None:
            max_partial_bytes = 4 * (max_message_bytes + CHUNK_CLAIM)
        cfg.max_partial_bytes = max_partial_bytes
        cfg.max_queued_messages = max_partial_messages if max_queued_messages is None else max_queued_messages
        cfg.max_queued_bytes = max_partial_bytes if max_queued_bytes is None else max_queued_bytes
        cfg.uplink_rate = uplink_rate
        cfg.drop_prob = drop_prob
        cfg.seed = seed
        cfg.socket_buffer = socket_buffer
        cfg.gso = int(gso)
        base_c = ffi.new("char[]", str(groups.network_address).encode())
        cfg.mcast_port = mcast_port
        cfg.mcast_group_base = base_c
        cfg.mcast_groups = groups.num_addresses
        cfg.mcast_ttl = mcast_ttl
        cfg.mcast_max_joined = mcast_max_joined
        out = ffi.new("p2p_engine **")
        check(lib.p2p_engine_open(cfg, out))
        self._eng = out[0]
        self._lock = threading.Lock()
        self._last: dict[int, Delivery] = {}
        # Sends in flight hold the caller's arrays: kept here too, so dropping a handle early is safe.
        self._inflight: list[SendHandle] = []
        self.sender_id = sender_id
        self.transport_mode = transport_mode
        self.multicast_reach: set[tuple[str, int]] = set()  # receivers probe_multicast found reachable
        self._probe_ids = itertools.cycle(PROBE_MSG_IDS)
        self._bad_descriptors = 0  # messages recv refused (stats)
        h, p = ffi.new("char[16]"), ffi.new("uint16_t *")
        lib.p2p_engine_address(self._eng, h, p)
        self.address: tuple[str, int] = (ffi.string(h).decode(), p[0])

    def _engine(self) -> Any:
        if self._eng is None:
            raise TransportError(9, "channel is closed")
        return self._eng

    @contextmanager
    def _held(self) -> Iterator[Any]:
        """The engine, kept alive for one call even if another thread closes the channel meanwhile
        (a blocked recv then raises "engine is closed")."""
        with self._lock:
            eng = self._engine()
            lib.p2p_engine_hold(eng)
        try:
            yield eng
        finally:
            lib.p2p_engine_release(eng)

    def send(self, msg_id: int, arrays: Sequence[Any], receivers: Iterable[Any],
             loss_bounds: float | Sequence[float] = 0.0, deadline: float | None = None,
             chunk_size: int | None = None, multicast: bool | Sequence[bool] | None = None, *,
             slow_close: float = 0.0, _probe: bool = False) -> SendHandle:
        """Start sending `arrays` as message `msg_id` to every receiver; returns at once.

        msg_id: 32 bits, but for PROBE_MSG_IDS; a receiver refuses one it delivered from this
            sender in the last 30 s.
        receivers: (host, port) or (host, port, rate in bytes/s; 0 = unpaced) each.
        loss_bounds: per array (or one for all), the fraction that may be missing at a receiver
            when the send to it closes early; 0 = exact delivery.
        deadline: seconds after which each receiver's send closes with whatever arrived.
        slow_close: S; 0 = off, else >= 1. Each paced receiver's send (rate > 0) closes with
            whatever arrived, result "slow", at S times its planned time (the message's wire bytes
            at its rate; a multicast receiver's: at its group's pace) from the start, or sooner once
            the arrival rate its ACKs measured projects its end past that. The receiver handles it
            as a deadline's close. See docs/slow-close.md for choosing S.
        multicast: True: every receiver through this sender's group; False: unicast; one bool
            per receiver: those marked True through the group, the others by unicast (a round's
            plan says which share the sender's multicast domain); None: as `transport_mode` says,
            for sends to two receivers or more (a group saves nothing for one). Multicast paces the
            group at its slowest receiver's rate; a receiver the group does not reach falls back to
            unicast whatever this says.
        """
        self._engine()
        if not 0 <= msg_id < 2**32:
            raise ValueError(f"msg_id must fit in 32 bits, got {msg_id}")
        if (msg_id in PROBE_MSG_IDS) != _probe:
            raise ValueError(f"msg_ids {PROBE_MSG_IDS[0]:#x}..{PROBE_MSG_IDS[-1]:#x} are probe_multicast's")
        views = [as_numpy(a) for a in arrays]
        bounds = [float(loss_bounds)] * len(views) if np.isscalar(loss_bounds) else [float(b) for b in loss_bounds]
        if len(bounds) != len(views):
            raise ValueError(f"{len(bounds)} loss bounds for {len(views)} arrays")
        rcv = [_receiver_tuple(r) for r in receivers]
        if len({(h, p) for h, p, _ in rcv}) != len(rcv):
            raise ValueError("a receiver is listed twice")
        if multicast is None or isinstance(multicast, bool):
            mode = ("unicast" if len(rcv) < 2 else self.transport_mode) if multicast is None else \
                "multicast" if multicast else "unicast"
            via_group = [mode == "multicast" or (mode == "auto" and (h, p) in self.multicast_reach) for h, p, _ in rcv]
        else:
            via_group = [bool(m) for m in multicast]
            if len(via_group) != len(rcv):
                raise ValueError(f"{len(via_group)} multicast flags for {len(rcv)} receivers")
        keep: list[Any] = []
        segs = ffi.new("p2p_segment[]", max(len(views), 1))
        for i, (v, b) in enumerate(zip(views, bounds)):
            buf = ffi.from_buffer(v.reshape(-1).view(np.uint8))
            keep.append(buf)
            segs[i].ptr = buf
            segs[i].len = v.nbytes
            segs[i].loss_bound = b
        rs = ffi.new("p2p_receiver[]", max(len(rcv), 1))
        for i, (h, p, rate) in enumerate(rcv):
            hc = ffi.new("char[]", h.encode())
            keep.append(hc)
            rs[i].host, rs[i].port, rs[i].rate, rs[i].multicast = hc, p, rate, via_group[i]
        opt = ffi.new("p2p_send_options *")
        desc = ffi.new("char[]", PROBE_DESCRIPTOR if _probe else encode_descriptor(views))
        opt.app, opt.app_len = desc, len(ffi.string(desc))
        opt.deadline_ms = 0 if deadline is None else max(1, int(deadline * 1000))
        opt.chunk_size = chunk_size or 0
        opt.slow_factor = slow_close
        out = ffi.new("p2p_send **")
        with self._held() as eng:
            check(lib.p2p_send_start(eng, msg_id, segs, len(views), rs, len(rcv), opt, out))
        keep.append(desc)
        handle = SendHandle(out[0], views, rcv, keep)
        self._inflight = [h for h in self._inflight if not h.done()] + [handle]
        return handle

    def probe_multicast(self, peers: Iterable[Any], timeout: float = 2.0) -> set[tuple[str, int]]:
        """Which of `peers` ((host, port) each) this sender's multicast group reaches: a small message
        sent through the group to all of them (never delivered by their `recv`). Remembered in
        `multicast_reach`, which "auto" sends go by. A peer that does not answer in `timeout`
        seconds (not up yet, or gone) counts as not reached: probe once every peer's engine is up."""
        peers = [_receiver_tuple(p)[:2] for p in peers]
        probe = np.zeros(1024, dtype=np.uint8)
        reached = set()
        for _ in range(2):  # the second once every peer's membership is known to the switch
            handle = self.send(next(self._probe_ids), [probe], peers, deadline=timeout / 2, chunk_size=128, multicast=True,
                               _probe=True)
            reached |= {st.receiver for st in handle.wait() if st.multicast and st.result in ("exact", "early_closed")}
        self.multicast_reach = (self.multicast_reach - set(peers)) | reached
        return reached

    def recv(self, timeout: float | None = None) -> Delivery | None:
        """The next delivered message, or None if none arrives within `timeout` seconds. A message
        whose descriptor does not describe its segments (a member's bug or a hostile key holder)
        comes without arrays, as one whose layout never arrived, and is counted
        (``drop_bad_descriptor`` in `stats`)."""
        out = ffi.new("p2p_delivery **")
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._held() as eng:
                if check(lib.p2p_recv(eng, ms, out)) == 1:
                    return None
            d = ffi.gc(out[0], lib.p2p_delivery_free)
            app = bytes(ffi.buffer(d.app, d.app_len)) if d.layout_known else None
            if app != PROBE_DESCRIPTOR:  # (else another peer's multicast probe: wait on for a message)
                layout = None if app is None else decode_descriptor(app, [d.seg_len[i] for i in range(d.nseg)])
                if app is not None and layout is None:
                    self._bad_descriptors += 1
                return self._wrap(d, layout)
            if deadline is not None:
                ms = max(0, int((deadline - time.monotonic()) * 1000))

    @staticmethod
    def _wrap(d: Any, layout: list[tuple[np.dtype, tuple[int, ...]]] | None) -> Delivery:
        """The delivery with its arrays (numpy views of engine memory, per `layout`), or without."""
        mask = np.unpackbits(np.frombuffer(ffi.buffer(d.chunk_mask, (d.nchunks + 7) // 8), dtype=np.uint8),
                             bitorder="little")[:d.nchunks].astype(bool)
        source = (ffi.string(d.src_host).decode(), d.src_port)
        arrays, offsets, fractions = None, [], []
        if layout is not None:
            raw = np.asarray(EngineMemory(d, int(ffi.cast("uintptr_t", d.data)), d.data_len))
            offsets = [d.seg_off[i] for i in range(d.nseg)]
            arrays = []
            for i, (dtype, shape) in enumerate(layout):
                piece = raw[offsets[i]:offsets[i] + d.seg_len[i]]
                arrays.append(piece.view(dtype).reshape(shape))
            fr = ffi.new("double[]", max(d.nseg, 1))
            check(lib.p2p_delivery_fractions(d, fr, d.nseg))
            fractions = [fr[i] for i in range(d.nseg)]
        return Delivery(sender=d.sender, msg_id=d.msg_id, arrays=arrays, mask=mask, reason=Reason(d.reason),
                        source=source, fractions=fractions, datagrams=d.datagrams_received,
                        chunk_size=d.chunk_size, meta_len=d.meta_len, offsets=offsets, _handle=d)

    def fill(self, delivery: Delivery, mode: str = "own", own: Sequence[Any] | None = None) -> Delivery:
        """Bubble filling: decide what stands where chunks are missing (done in C, in place).

        mode "own": the bytes of `own` (e.g. the receiver's own parameters, so a lost chunk means
            "no change"); "zero": zeros; "last": the same sender's previous message (filled
            before), or `own` if there is none yet.
        """
        if delivery.arrays is None:
            raise ValueError("the message's layout never arrived; nothing to fill")
        if mode not in ("own", "zero", "last"):
            raise ValueError(f"fill mode must be own, zero or last, got {mode!r}")
        source = own
        if mode == "last":
            prev = self._last.get(delivery.sender)
            source = prev.arrays if prev is not None else own
            self._last[delivery.sender] = delivery
        if mode == "zero":
            check(lib.p2p_fill(delivery._handle, lib.P2P_FILL_ZERO, ffi.NULL, 0))
            return delivery
        if source is None:
            raise ValueError(f"fill mode {mode!r} needs `own` arrays")
        views = [as_numpy(a) for a in source]
        segs = ffi.new("p2p_segment[]", max(len(views), 1))
        keep = []
        for i, v in enumerate(views):
            buf = ffi.from_buffer(v.reshape(-1).view(np.uint8))
            keep.append(buf)
            segs[i].ptr, segs[i].len = buf, v.nbytes
        check(lib.p2p_fill(delivery._handle, lib.P2P_FILL_COPY, segs, len(views)))
        return delivery

    def stats(self) -> dict[str, int]:
        """Engine counters: bytes and datagrams each way, retransmissions, drops by reason (the
        quotas': ``drop_evicted``, partial messages; ``drop_queue_full``, delivered ones not taken
        yet); gauges of what it holds now (``receiving_*``, ``queued_*``); and
        ``drop_bad_descriptor``, messages `recv` refused."""
        c = ffi.new("p2p_counters *")
        with self._held() as eng:
            lib.p2p_engine_counters(eng, c)
        return {**{name: getattr(c, name) for name, _ in ffi.typeof("p2p_counters").fields},
                "drop_bad_descriptor": self._bad_descriptors}

    def close(self) -> None:
        """Stop the engine; sends in flight end as "cancelled". Received arrays stay valid."""
        with self._lock:
            if self._eng is not None:
                lib.p2p_engine_close(self._eng)
                self._eng = None
                self._last.clear()
                self._inflight.clear()

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_eng", None) is not None:
            self.close()
