"""The coordinator: rendezvous, membership, failure detection, clock table and global view.

It runs as a thread in the launcher (or in rank 0 when there is no launcher) and serves two
ZeroMQ sockets: a ROUTER for requests and heartbeats, and a PUB that pushes events (joins,
deaths, the slowest clock, the global view once per round, and a tick every heartbeat so
clients can tell that the coordinator is alive). Nothing here carries tensors.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from . import protocol as p
from .estimator import BandwidthEstimator
from .membership import Member
from .view import GlobalView


@dataclass(frozen=True)
class Progress:
    """What the launcher shows: the slowest live clock and the highest clock ever reported, the
    mean loss of the live peers (after they are gone: the last loss reported), and the slowest
    peer (lowest clock, then longest step time)."""

    min_clock: int
    max_clock: int
    alive: int
    loss: float | None
    slowest: int | None


class Coordinator:
    """Serve the control plane of one job.

    - ``job_id`` / ``key``: messages not signed with ``key`` for ``job_id`` are refused.
    - ``world_size``: the initial size (the view has at least this many entries).
    - ``bind``: ZeroMQ endpoint for requests, e.g. ``tcp://127.0.0.1:0`` (0 = any free port),
      ``tcp://0.0.0.0:29450`` for other hosts, or ``ipc:///tmp/job/ctl`` (reachable from network
      namespaces, which share the file system). The PUB socket binds next to it.
    - ``advertise``: the host clients should use when ``bind`` is a wildcard address.
    - ``heartbeat``: seconds between client heartbeats (and coordinator ticks); smaller detects
      deaths sooner at the cost of more messages. ``dead_after``: missed heartbeats before a
      peer is declared dead; raise it on a heavily loaded machine to avoid false deaths.
    - ``rates``: ``{rank: (uplink, downlink)}`` in bytes/s seeding the estimator
      (``estimator.seed_rates(topology)`` makes one from a topology).
    """

    def __init__(self, job_id: str, key: str | bytes, *, world_size: int = 0, bind: str = "tcp://127.0.0.1:0",
                 advertise: str | None = None, heartbeat: float = 0.5, dead_after: int = 3,
                 rates: Mapping[int, tuple[float, float]] | None = None) -> None:
        self.job_id = job_id
        self.world_size = world_size
        self.heartbeat = heartbeat
        self.dead_after = dead_after
        self._key = p.job_key(key)
        self._estimator = BandwidthEstimator(rates)
        self._members: dict[int, Member] = {}
        self._sessions: dict[int, str] = {}
        self._last_seen: dict[int, float] = {}
        self._size = world_size  # entries in the view: the highest rank ever seen + 1
        self._epoch = 0
        self._min_clock = 0
        self._plans: dict[int, tuple[dict[int, list[tuple[int, float]]], float]] = {}
        self._message_bytes: dict[int, float] = {}
        self._max_clock = 0
        self._last_loss: float | None = None
        self._fast_ticks_until = 0.0
        self._next_tick = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ctx = zmq.Context.instance()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._pub = self._ctx.socket(zmq.PUB)
        for sock in (self._router, self._pub):
            sock.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.address = self._bind(self._router, bind, advertise)
        self.pub_address = self._bind(self._pub, _pub_endpoint(bind), advertise)
        self._thread = threading.Thread(target=self._run, name="p2plearn-coordinator", daemon=True)

    @staticmethod
    def _bind(sock: zmq.Socket, bind: str, advertise: str | None) -> str:
        ep = p.endpoint(bind)
        if ep.startswith("tcp://") and ep.endswith(":0"):
            ep = ep[:-2] + ":*"
        sock.bind(ep)
        bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if bound.startswith("tcp://0.0.0.0:") or bound.startswith("tcp://*:"):
            bound = f"tcp://{advertise or '127.0.0.1'}:{bound.rsplit(':', 1)[1]}"
        return bound

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Coordinator:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; clients see the coordinator dead after their timeout."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        self._router.close()
        self._pub.close()

    def __enter__(self) -> Coordinator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the launcher and tests read (thread-safe snapshots) ------------------------------

    def members(self) -> dict[int, Member]:
        with self._lock:
            return {r: Member(**m.to_dict()) for r, m in self._members.items()}

    def view(self) -> GlobalView:
        with self._lock:
            return self._view()

    def progress(self) -> Progress:
        with self._lock:
            ms = list(self._members.values())
            losses = [m.loss for m in ms if m.loss is not None]
            slowest = min(ms, key=lambda m: (m.clock, -(m.step_time or 0.0)), default=None)
            return Progress(min_clock=self._min_clock, max_clock=self._max_clock, alive=len(ms),
                            loss=float(np.mean(losses)) if losses else self._last_loss,
                            slowest=slowest.rank if slowest else None)

    # -- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        # Deaths are checked five times per heartbeat so that a death is announced at most
        # heartbeat/5 after the deadline (the 2 s bound has room for scheduling delays).
        check = self.heartbeat / 5
        while not self._stop.is_set():
            if poller.poll(timeout=check * 1000):
                while self._router.poll(0):
                    self._handle(self._router.recv_multipart())
            now = time.monotonic()
            with self._lock:
                self._reap(now)
                if now >= self._next_tick:
                    self._publish(p.TICK, epoch=self._epoch, min_clock=self._min_clock)
                    # Tick faster for a moment after a hello: a new client waits for its first tick
                    # to know that its subscription is live.
                    self._next_tick = now + (check if now < self._fast_ticks_until else self.heartbeat)

    def _handle(self, frames: list[bytes]) -> None:
        ident, msg = frames[0], frames[1:]
        try:
            body, _ = p.unpack(self._key, self.job_id, msg)
        except p.AuthError as exc:
            self._router.send_multipart([ident, *p.refusal(str(exc), _untrusted_id(msg))])
            return
        kind = body.get("type")
        handler = getattr(self, f"_on_{kind}", None)
        with self._lock:
            try:
                reply = handler(body) if handler else {"type": p.ERROR, "reason": f"unknown request {kind!r}"}
            except (KeyError, TypeError, ValueError) as exc:
                reply = {"type": p.ERROR, "reason": f"bad {kind} request: {exc!r}"}
        if reply is not None:
            blobs = reply.pop("_blobs", None)
            self._router.send_multipart([ident, *p.pack(self._key, self.job_id, {**reply, "id": body.get("id")}, blobs)])

    def _publish(self, kind: str, blobs: list[bytes] | None = None, **body: Any) -> None:
        self._pub.send_multipart(p.pack(self._key, self.job_id, {"type": kind, **body}, blobs))

    # -- requests (called with the lock held) -----------------------------------------------------

    def _on_hello(self, body: dict) -> dict:
        self._fast_ticks_until = time.monotonic() + 2 * self.heartbeat
        self._next_tick = 0.0
        return {"type": p.OK, "pub": self.pub_address, "heartbeat": self.heartbeat,
                "dead_after": self.dead_after, "world_size": self.world_size}

    def _on_register(self, body: dict) -> dict:
        rank, join, session = body.get("rank"), bool(body.get("join")), str(body["session"])
        if rank is None:
            if not join:
                return {"type": p.ERROR, "reason": "register needs a rank (only a joining peer may ask for one)"}
            rank = next(r for r in range(len(self._members) + 1) if r not in self._members)
        rank = int(rank)
        if rank < 0:
            return {"type": p.ERROR, "reason": f"rank {rank} is negative"}
        if rank in self._members and self._sessions[rank] != session:
            return {"type": p.ERROR, "reason": f"rank {rank} is already registered by another process"}
        engine = body.get("engine")
        known = self._members.get(rank)
        donor = None
        if known is None:
            if join:
                donor = max(self._members.values(), key=lambda m: (m.clock, -m.rank), default=None)
            clock = donor.clock if donor else self._min_clock
            self._members[rank] = Member(rank=rank, host=str(body.get("host", "")),
                                         engine=tuple(engine) if engine else None, clock=clock)
            self._sessions[rank] = session
            self._size = max(self._size, rank + 1)
            self._epoch += 1
            self._publish(p.MEMBER, event="join", epoch=self._epoch, member=self._members[rank].to_dict())
            if donor is not None:
                self._publish(p.DONATE, to=donor.rank, rank=rank, engine=engine, clock=clock)
        elif engine and tuple(engine) != known.engine:  # the same process again: a new engine address
            known.engine = tuple(engine)
            self._epoch += 1
            self._publish(p.MEMBER, event="update", epoch=self._epoch, member=known.to_dict())
        self._last_seen[rank] = time.monotonic()
        return {"type": p.OK, "rank": rank, "clock": self._members[rank].clock, **self._snapshot(),
                "donor": donor.to_dict() if donor else None}

    def _on_heartbeat(self, body: dict) -> dict | None:
        rank = int(body["rank"])
        if self._sessions.get(rank) != body.get("session") or rank not in self._members:
            return {"type": p.ERROR, "reason": "expelled", "expelled": True}
        self._last_seen[rank] = time.monotonic()
        return None

    def _on_report(self, body: dict) -> dict | None:
        reply = self._on_heartbeat(body)
        if reply is not None:
            return reply
        member = self._members[int(body["rank"])]
        member.clock = max(member.clock, int(body["clock"]))
        self._max_clock = max(self._max_clock, member.clock)
        if body.get("loss") is not None:
            member.loss = self._last_loss = float(body["loss"])
        member.step_time = body.get("step_time", member.step_time)
        links = {int(j): s for j, s in (body.get("links") or {}).items()}
        self._estimator.observe(member.rank, int(body["clock"]), links, bool(body.get("saturated")))
        self._advance_clock()
        return None

    def _on_members(self, body: dict) -> dict:
        return {"type": p.OK, **self._snapshot()}

    def _on_view(self, body: dict) -> dict:
        header, blobs = self._view().to_blobs()
        return {"type": p.OK, "view": header, "_blobs": blobs}

    def _on_plan(self, body: dict) -> dict:
        """This round's plan, computed once from the view when the first peer asks, so that every
        peer acts on the same plan. Each receiver comes with the rate to pace it at: its
        downlink shared by the senders that chose it, capped by the sender's uplink share."""
        rnd, rank = int(body["round"]), int(body["rank"])
        self._message_bytes[rank] = float(body["bytes"])
        if rnd not in self._plans:
            self._plans[rnd] = self._make_plan(rnd, body)
            for old in [r for r in self._plans if r < self._min_clock - PLANS_KEPT]:
                del self._plans[old]
        plan, planned_time = self._plans[rnd]
        senders = sorted(i for i, rs in plan.items() if any(j == rank for j, _ in rs))
        return {"type": p.OK, "receivers": plan.get(rank, []), "senders": senders, "planned_time": planned_time,
                "fanout": sum(len(rs) for rs in plan.values()) / max(1, len(plan))}

    def _make_plan(self, rnd: int, body: dict) -> tuple[dict[int, list[tuple[int, float]]], float]:
        from p2plearn.selection import NetworkView, make_policy, plan_flows, plan_time  # the sync layer's peer

        view = self._view()
        default = float(body["bytes"])
        sizes = np.array([self._message_bytes.get(r, default) for r in range(view.size)])
        net = NetworkView.from_global(view, sizes)
        plan = make_policy(str(body["policy"]), seed=int(body["seed"])).plan(net, int(body["fanout"]), rnd)
        rates: dict[int, list[tuple[int, float]]] = {i: [] for i in plan}
        for i, j, rate in zip(*plan_flows(net, plan)):
            rates[int(i)].append((int(j), float(rate)))
        return rates, plan_time(net, plan)

    def _on_leave(self, body: dict) -> dict:
        rank = int(body["rank"])
        if self._sessions.get(rank) == body.get("session"):
            self._remove(rank, "leave")
        return {"type": p.OK}

    # -- membership and clocks (lock held) ----------------------------------------------------------

    def _snapshot(self) -> dict:
        return {"members": [m.to_dict() for m in self._members.values()], "epoch": self._epoch,
                "min_clock": self._min_clock}

    def _view(self) -> GlobalView:
        alive = np.zeros(self._size, dtype=bool)
        clock = np.zeros(self._size, dtype=np.int64)
        for r, m in self._members.items():
            alive[r], clock[r] = True, m.clock
        return GlobalView(round=self._min_clock, alive=alive, clock=clock, **self._estimator.arrays(self._size))

    def _reap(self, now: float) -> None:
        limit = self.heartbeat * self.dead_after
        for rank in [r for r, t in self._last_seen.items() if now - t > limit]:
            self._remove(rank, "dead")

    def _remove(self, rank: int, event: str) -> None:
        member = self._members.pop(rank)
        del self._sessions[rank], self._last_seen[rank]
        self._estimator.forget(rank)
        self._epoch += 1
        self._publish(p.MEMBER, event=event, epoch=self._epoch, member=member.to_dict())
        self._advance_clock()

    def _advance_clock(self) -> None:
        """Publish the slowest live clock when it moves, and the view once per completed round."""
        if not self._members:
            return
        low = min(m.clock for m in self._members.values())
        if low != self._min_clock:
            self._min_clock = low
            self._estimator.close_round(low)
            self._publish(p.CLOCK, min_clock=low)
            header, blobs = self._view().to_blobs()
            self._publish(p.VIEW, view=header, blobs=blobs)


PLANS_KEPT = 64  # rounds of plans kept behind the slowest clock (SSP peers may ask late)


def _pub_endpoint(bind: str) -> str:
    """The PUB socket's endpoint: same host on a free port, or a sibling ipc path."""
    ep = p.endpoint(bind)
    if ep.startswith("ipc://"):
        return ep + ".pub"
    return ep.rsplit(":", 1)[0] + ":0"


def _untrusted_id(msg: list[bytes]) -> Any:
    """The request id of a refused message, so that its sender can match the refusal."""
    try:
        return json.loads(msg[0]).get("id")
    except (ValueError, AttributeError, IndexError):
        return None
