"""The membership table: the coordinator's soft state of one job and its rules, without sockets.

Who is a member and under which session, when a silent member is declared dead (one phi-accrual
detector per member, see ``detector``), which donor sends a joiner the model state, the slowest
and fastest clocks, and the global view with its versions (its inputs per rank and its
publication rule in ``job_view``): every decision the coordinator makes is made here. Each change returns the broadcasts it calls for (``Publication``), in the order the
coordinator must send them, and each request its reply; the coordinator (``Coordinator``) only
receives, checks the fields, calls the table, publishes what it returns and replies.

Not thread-safe: the coordinator calls it with its lock held.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import protocol as p
from .detector import PhiAccrualDetector
from .fields import Resume
from .job_view import JobView
from .membership import Member
from .progress import Progress
from .publication import Publication
from .view import GlobalView

log = logging.getLogger("p2plearn.control")

RANK_HEADROOM = 1024  # a new rank may exceed the job's size by at most this (the view has an entry per rank)


class MembershipTable:
    """The members of one job, their clocks and the global view, changed only by the requests
    (``register``, ``heartbeat``, ``report``, ``state``, ``reach``, ``leave``), lost connections
    (``disconnected``) and the passing of time (``reap``).

    - ``world_size``: the initial size (the view has at least this many entries).
    - ``heartbeat_interval``: seconds between client heartbeats; seeds each member's detector.
    - ``phi_threshold``: suspicion level at which a silent member is declared dead (see
      ``PhiAccrualDetector``): lower detects sooner, with more false deaths on a loaded machine.
    - ``startup_grace``: a member that has not reported its first round is declared dead after
      this many seconds without a heartbeat, or soon after its last connection closed.
    - ``rates``: ``{rank: (uplink, downlink)}`` in bytes/s seeding the bandwidth estimator.
    - ``term``: the coordinator's incarnation, stamped on every view.

    A request it refuses with an exception changes nothing: every field it reads is checked first.
    """

    def __init__(self, world_size: int = 0, *, heartbeat_interval: float = 0.5, phi_threshold: float = 8.0,
                 startup_grace: float = 60.0, rates: Mapping[int, tuple[float, float]] | None = None,
                 term: int = 0) -> None:
        self.world_size = world_size
        self.heartbeat_interval = heartbeat_interval
        self.phi_threshold = phi_threshold
        self.startup_grace = startup_grace
        self._job_view = JobView(world_size, rates, term)  # its inputs per rank, the versions published
        self._members: dict[int, Member] = {}
        self._sessions: dict[int, str | None] = {}  # None: presumed from a resume, not re-registered yet
        self._detectors: dict[int, PhiAccrualDetector] = {}
        self._awaiting_state: set[int] = set()  # joiners a donor was asked to send the state to
        self._resumed = False
        self._epoch = 0
        self._min_clock = 0
        self._max_clock = 0
        self._last_loss: float | None = None
        # Broadcasts of the change under way, handed to the caller as it returns (``_done``).
        self._outbox: list[Publication] = []
        self.connections: dict[int, int] = {}  # connection id (a socket's fd) -> rank, from signed messages
        self.registrations = 0  # registrations served, ever
        self.most_members = 0  # the most members at once, ever

    @property
    def term(self) -> int:
        """The coordinator's incarnation, stamped on every view."""
        return self._job_view.term

    @property
    def most_planned(self) -> int:
        """The most receivers a published view planned, ever."""
        return self._job_view.most_planned

    # -- what the coordinator reads --------------------------------------------------------------

    def members(self) -> dict[int, Member]:
        """A copy of the membership."""
        return {r: Member(**m.to_dict()) for r, m in self._members.items()}

    def registered(self) -> int:
        """Members that registered here themselves; members presumed from a successor's hand-over
        (not re-registered yet) are not counted: once every peer that did has left, the job is over."""
        return sum(session is not None for session in self._sessions.values())

    def snapshot(self) -> dict:
        """The membership, and the most members (and receivers a view planned) ever at once: a peer
        that missed the joins of peers that came and left tells from these that the job started."""
        return {"members": [m.to_dict() for m in self._members.values()], "epoch": self._epoch,
                "min_clock": self._min_clock, "most_members": self.most_members, "most_planned": self.most_planned}

    def progress(self) -> Progress:
        ms = list(self._members.values())
        losses = [m.loss for m in ms if m.loss is not None]
        slowest = min(ms, key=lambda m: (m.clock, -(m.step_time or 0.0)), default=None)
        return Progress(min_clock=self._min_clock, max_clock=self._max_clock, alive=len(ms),
                        loss=float(np.mean(losses)) if losses else self._last_loss,
                        slowest=slowest.rank if slowest else None)

    def view(self) -> GlobalView:
        """The view as things stand (the published one may plan with older inputs: ``JobView.publish``)."""
        return self._job_view.current(self._members, self._min_clock)

    def watch(self, now: float) -> dict[str, Any]:
        """What a monitor shows (``p2plearn.monitor``), a copy: the members, each one's suspicion
        (phi) at ``now`` and its last reported flows, the view, the progress, epoch and term. Taken
        every tick, so each member is a shallow copy of its fields (values), a tenth of ``members()``'s cost."""
        return {"members": {r: dict(vars(m)) for r, m in self._members.items()},
                "phi": {r: d.phi(now) for r, d in self._detectors.items()}, "links": dict(self._job_view.links), "view": self.view(), "progress": self.progress(),
                "epoch": self._epoch, "term": self.term}

    def tick(self) -> Publication:
        """The coordinator's heartbeat to its clients, with the job's progress."""
        return Publication(p.TICK, {"epoch": self._epoch, "min_clock": self._min_clock, "term": self.term,
                                    "progress": self.progress().to_dict()})

    def ended(self) -> Publication:
        """The end of the job, with the most members ever at once: a peer still starting knows the job ran."""
        return Publication(p.ENDED, {"term": self.term, "most_members": self.most_members,
                                     "most_planned": self.most_planned})

    # -- requests --------------------------------------------------------------------------------

    def register(self, rank: int | None, session: str, *, join: bool, host: str, engine: tuple[str, int] | None,
                 standby: str | None, clock: int, resume: Resume | None,
                 link_rate: float | None) -> tuple[dict, list[Publication]]:
        """A process registers ``rank`` (None: a joiner asking for the lowest free one) under
        ``session``, at ``clock``; ``resume``: the hand-over of a successor's first re-registration.
        A rank the job does not know yet is admitted (with a donor when it missed rounds); a member
        presumed from a hand-over is confirmed; a known member may move its engine or standby."""
        if rank is None:
            if not join:
                return self._done({"type": p.ERROR,
                                   "reason": "register needs a rank (only a joining peer may ask for one)"})
        elif rank not in self._members and rank >= max(self._job_view.size, self.world_size) + RANK_HEADROOM:
            return self._done({"type": p.ERROR,
                               "reason": f"rank {rank} is far beyond the job's {self._job_view.size} ranks"})
        if resume is not None and not self._resumed:
            self._adopt(resume)
        if rank is None:
            rank = next(r for r in range(len(self._members) + 1) if r not in self._members)
        if rank in self._members and self._sessions[rank] not in (None, session):
            return self._done({"type": p.ERROR, "reason": f"rank {rank} is already registered by another process"})
        self._job_view.estimator.seed_link(rank, link_rate)  # sent with the engine's address
        known = self._members.get(rank)
        if known is not None and self._sessions[rank] is None and resume is None:
            # Presumed from a hand-over, but this is a new process (restarted): the one presumed is gone.
            self._remove(rank, "dead")
            known = None
        donor = None
        resumed = resume.clock if resume is not None else None
        if known is None:
            # A process that registers a rank the job does not know once rounds have been made (a
            # restarted peer) holds no current model: like a joiner, it gets one from a donor.
            join = join or (resumed is None and self._max_clock > 0)
            if join:
                donor = self._donor(exclude=rank)
                if donor is not None and donor.clock <= clock:
                    donor = None  # it misses nothing (a false death at start-up, say): no state to send
                start = donor.clock if donor else max(clock, self._min_clock)
            else:
                start = resumed if resumed is not None else self._min_clock
            self._admit(Member(rank=rank, host=host, engine=engine, clock=start, standby=standby), session, donor)
        else:
            donor = self._confirm(known, session, engine, standby, resumed)
        self._detectors[rank].heartbeat()
        self.registrations += 1
        header, view_blobs = self.view().to_blobs()
        return self._done({"type": p.OK, "rank": rank, "clock": self._members[rank].clock, **self.snapshot(),
                           "donor": donor.to_dict() if donor else None, "view": header, "_blobs": view_blobs})

    def heartbeat(self, rank: int, session: Any) -> dict | None:
        """A member's heartbeat; the reply (None: none) tells a process that is no member (declared
        dead, or unknown to this coordinator) to re-register as a joiner, so that a donor sends it
        the state it missed."""
        if self._is_member(rank, session):
            self._detectors[rank].heartbeat()
            return None
        return _expelled()

    def report(self, rank: int, session: Any, *, clock: int, loss: float | None, step_time: float | None,
               message_bytes: float | None, links: dict[int, dict[str, Any]],
               load: dict[str, float]) -> tuple[dict | None, list[Publication]]:
        """A member finished round ``clock``: its measurements (``fields.read_links`` and
        ``read_load`` read the last two); a heartbeat too."""
        reply = self.heartbeat(rank, session)
        if reply is not None:
            return self._done(reply)
        member = self._members[rank]
        self._detectors[rank].end_warmup()  # it is training: its heartbeats now come in rhythm
        self._awaiting_state.discard(rank)  # it reports rounds only once it holds a state
        member.clock = max(member.clock, clock)
        self._max_clock = max(self._max_clock, member.clock)
        if loss is not None:
            member.loss = self._last_loss = loss
        if step_time is not None:
            member.step_time = step_time
        self._job_view.record(rank, clock, message_bytes, links, load)
        self._advance_clock()
        return self._done(None)

    def state(self, rank: int, session: Any) -> tuple[dict, list[Publication]]:
        """A joiner whose state did not come (its donor died, or the state went to an address
        the donor had not yet learned was gone): ask a donor again."""
        if not self._is_member(rank, session):
            return self._done(_expelled())
        member = self._members[rank]
        donor = self._donor(exclude=rank)
        if donor is not None:
            member.clock = max(member.clock, donor.clock)
            self._awaiting_state.add(rank)
            self._emit(p.DONATE, to=donor.rank, rank=rank, engine=member.engine, clock=member.clock)
            self._advance_clock()
        return self._done({"type": p.OK, "donor": donor.to_dict() if donor else None})

    def reach(self, rank: int, session: Any, reached: Any) -> tuple[dict, list[Publication]]:
        """Which ranks a member's multicast probe reached (a list of ranks of the job, else
        TypeError or ValueError); the view's ``mcast_domain`` follows (``domains_from_reach``).
        Ranks that are no longer members are left out (they died since)."""
        if not self._is_member(rank, session):
            return self._done(_expelled())
        if not isinstance(reached, list) or not all(isinstance(j, int) and not isinstance(j, bool) for j in reached):
            raise TypeError(f"reached must be a list of ranks, got {str(reached)[:100]}")
        size = self._job_view.size
        out = [j for j in reached if not 0 <= j < size]
        if out:
            raise ValueError(f"reached ranks {out[:10]} are out of range (the job has ranks 0..{size - 1})")
        self._job_view.reach[rank] = {j for j in reached if j in self._members and j != rank}
        self._publish_view()
        return self._done({"type": p.OK})

    def leave(self, rank: int, session: Any) -> list[Publication]:
        """A member leaves cleanly (a stale session leaves nobody)."""
        if self._is_member(rank, session):
            self._remove(rank, "leave")
        return self._take()

    # -- deaths and failover -----------------------------------------------------------------------

    def note_connection(self, connection: int, rank: Any, session: Any) -> None:
        """Remember which member a connection belongs to (signed messages with its session only)."""
        if isinstance(rank, int) and self._is_member(rank, session):
            self.connections[connection] = rank

    def disconnected(self, connection: int) -> None:
        """A connection closed; once a member's last one has, its process is taken for gone
        (``PhiAccrualDetector.lost``) unless a heartbeat comes within one interval."""
        rank = self.connections.pop(connection, None)
        # A peer has two connections (requests, heartbeats): only the last one closing means its
        # process is gone.
        if rank is not None and rank in self._detectors and rank not in self.connections.values():
            self._detectors[rank].lost()

    def reap(self, now: float) -> list[Publication]:
        """Declare dead the members suspected at ``now`` (``time.monotonic()``)."""
        for rank in [r for r, d in self._detectors.items() if d.suspected(now)]:
            d = self._detectors[rank]
            log.warning("rank %d declared dead: silent for %.2f s (%s)", rank, now - d.last, d.verdict(now))
            self._remove(rank, "dead")
        return self._take()

    def remove(self, rank: int, event: str) -> list[Publication]:
        """Take member ``rank`` out of the job (``event``: "leave" or "dead"), as ``leave`` and ``reap`` do."""
        self._remove(rank, event)
        return self._take()

    def adopt(self, resume: Resume) -> list[Publication]:
        """A successor's first re-registration: the membership and the view its sender held (what
        ``register`` does with its ``resume`` before anything else)."""
        self._adopt(resume)
        return self._take()

    # -- rules ---------------------------------------------------------------------------------------

    def _remove(self, rank: int, event: str) -> None:
        member = self._members.pop(rank)
        del self._sessions[rank], self._detectors[rank]
        self._awaiting_state.discard(rank)
        self.connections = {i: r for i, r in self.connections.items() if r != rank}
        self._job_view.forget(rank)
        self._epoch += 1
        self._emit(p.MEMBER, event=event, epoch=self._epoch, member=member.to_dict())
        if not self._advance_clock():
            self._publish_view()

    def _adopt(self, resume: Resume) -> None:
        self._resumed = True
        view = resume.view
        if view is not None:
            self._job_view.adopt(view)
        for member in resume.members:
            if member.rank not in self._members:
                if view is not None and member.rank < view.size:
                    member.clock = max(member.clock, int(view.clock[member.rank]))  # members' clocks go stale
                self._members[member.rank] = member
                self._sessions[member.rank] = None
                # The others re-register as soon as they notice the failover; one still starting
                # (clock 0: importing torch, say) may not look for seconds.
                grace = self.startup_grace if member.clock == 0 else max(3.0, 6 * self.heartbeat_interval)
                self._detectors[member.rank] = self._detector(grace)
                self._job_view.grow(member.rank)
        self._epoch = max(self._epoch, resume.epoch) + 1
        self._max_clock = max((m.clock for m in self._members.values()), default=0)
        self._min_clock = min((m.clock for m in self._members.values()), default=0)
        self._publish_view()

    def _is_member(self, rank: int, session: Any) -> bool:
        return rank in self._members and self._sessions.get(rank) == session

    def _admit(self, member: Member, session: str | None, donor: Member | None) -> None:
        """Add ``member``; with a donor, ask it to send the member the model state."""
        rank = member.rank
        self._members[rank] = member
        self._sessions[rank] = session
        self.most_members = max(self.most_members, len(self._members))
        # In its grace period until it reports a round: its first imports may stall it for seconds.
        self._detectors[rank] = self._detector(self.startup_grace)
        self._job_view.grow(rank)
        self._epoch += 1
        self._emit(p.MEMBER, event="join", epoch=self._epoch, member=member.to_dict())
        if donor is not None:
            self._awaiting_state.add(rank)
            self._emit(p.DONATE, to=donor.rank, rank=rank, engine=member.engine, clock=member.clock)
        # The slowest clock includes it now: alone in the job, it would otherwise wait on the clock
        # of members gone before it came (no one reports a round to move it).
        if not self._advance_clock():
            self._publish_view()

    def _confirm(self, known: Member, session: str, engine: tuple[str, int] | None, standby: str | None,
                 resumed: int | None) -> Member | None:
        """A member registers again (a re-registration after a failover, or a presumed member's
        own): take its session, engine and standby; returns the donor asked to send it the state."""
        rank = known.rank
        self._sessions[rank] = session
        donor = None
        if resumed is not None and resumed < self._min_clock:
            # Behind every other member: a process restarted while the job failed over, which
            # registered at a stale coordinator and followed it here. Its model is not the job's.
            donor = self._donor(exclude=rank)
            # The presumed process's engine is gone (the new one registers its own): no state
            # may go there, so the donor learns of the change before it is asked to donate.
            known.engine = engine
            self._epoch += 1
            self._emit(p.MEMBER, event="update", epoch=self._epoch, member=known.to_dict())
        if donor is not None:
            known.clock = donor.clock
            self._awaiting_state.add(rank)
            self._emit(p.DONATE, to=donor.rank, rank=rank, engine=known.engine, clock=known.clock)
            self._advance_clock()
        elif resumed is not None:
            known.clock = max(known.clock, resumed)
            self._advance_clock()  # BSP peers far ahead wait on it, and report no round meanwhile
        if (engine and engine != known.engine) or (standby and standby != known.standby):
            if engine and engine != known.engine:
                self._job_view.forget_reach(rank)  # the others' probes reached its old engine
            known.engine = engine or known.engine
            known.standby = standby or known.standby
            self._epoch += 1
            self._emit(p.MEMBER, event="update", epoch=self._epoch, member=known.to_dict())
            self._publish_view()  # after the member: whoever plans with it knows where it receives
        return donor

    def _donor(self, exclude: int) -> Member | None:
        """The most advanced live peer (lowest rank on ties), preferring one that holds its state
        now to a joiner still waiting for its own (which would pass it on only once it has it)."""
        candidates = (m for m in self._members.values() if m.rank != exclude)
        return max(candidates, key=lambda m: (m.rank not in self._awaiting_state, m.clock, -m.rank), default=None)

    def _detector(self, grace: float) -> PhiAccrualDetector:
        """A new member's detector, in its grace period (``grace`` s of silence) until it reports a
        round. Silence of ``max(1 s, 2 heartbeats)`` is always forgiven: a peer's heartbeat thread
        waits for the interpreter lock behind the training loop, and on a busy host for a core."""
        return PhiAccrualDetector(self.heartbeat_interval, threshold=self.phi_threshold,
                                  acceptable_pause=max(1.0, 2 * self.heartbeat_interval), grace=grace, warmup=None)

    def _advance_clock(self) -> bool:
        """Publish the slowest live clock when it moves, and with it the view (once per completed
        round); True if it moved."""
        # A joiner waiting for its state reports no round until it has one, and gets one from a
        # donor's next step: were it the slowest, a donor could wait on it (BSP's lead bound) for
        # the cap before sending it anything.
        low = min((m.clock for m in self._members.values() if m.rank not in self._awaiting_state),
                  default=self._min_clock)
        if low == self._min_clock:
            return False
        self._min_clock = low
        self._job_view.estimator.close_round(low)
        self._emit(p.CLOCK, min_clock=low)
        self._publish_view()
        return True

    def _publish_view(self) -> None:
        """Push the view (``JobView.publish`` says which version)."""
        header, blobs = self._job_view.publish(self._members, self._min_clock, self._max_clock).to_blobs()
        self._emit(p.VIEW, blobs, view=header)

    def _emit(self, kind: str, blobs: list[bytes] | None = None, **body: Any) -> None:
        self._outbox.append(Publication(kind, body, blobs))

    def _take(self) -> list[Publication]:
        """The broadcasts of the change just made, in order."""
        out, self._outbox = self._outbox, []
        return out

    def _done(self, reply: dict | None) -> tuple[dict | None, list[Publication]]:
        return reply, self._take()


def _expelled() -> dict:
    """The reply to a process that is no member: it registers again (as a joiner)."""
    return {"type": p.ERROR, "reason": "expelled", "expelled": True}
