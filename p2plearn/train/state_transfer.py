"""`StateTransfer`: the model state a joining (or readmitted) peer takes from a running job.

The control plane only introduces: it names a donor to the joiner and tells the donor (a
``donate`` event). The state itself travels through the data engine, as one whole-model message
(id ``STATE_FLAG | clock``) paced like a round's flows, sent from a copy of the model so that the
donor's training goes on meanwhile. A peer taken for dead while paused or stalled is told
``readmitted`` (it takes the state again at its next step) or ``expelled`` (it stops).

Tuning: ``ASK_AGAIN_S`` is how long a joiner waits before asking for another donation (a donor may
die, or send before it learned the joiner's engine); ``STATE_POLL_S`` how often it looks meanwhile
whether its donor or the job is gone.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np

from p2plearn.control import ControlError
from p2plearn.control.membership import Event
from p2plearn.protocols import ControlClient, DataChannel
from p2plearn.selection import NetworkView, plan_flows
from p2plearn.sync import Synchronizer
from p2plearn.sync.inbox import STATE_FLAG
from p2plearn.train.staging import HostStaging

ASK_AGAIN_S = 10.0  # a joiner without its state after this long asks for another donation
STATE_POLL_S = 0.2  # how often a joiner waiting for its state looks whether its donor or the job is gone
FINAL_ID = STATE_FLAG | (STATE_FLAG - 1)  # the message id of a final model: no round or join uses it


class JobEnded(SystemExit):
    """The job ended before this peer finished: it was stopped or stalled while the others trained to
    the end and left, so no peer is left to send it the model, and its own is stale. Uncaught, Python
    prints its one line and exits with code 1, as for any rank that could not finish its part."""


def paced(client: ControlClient, sender: int, receiver: int, engine: tuple[str, int],
          transfers: dict[int, list[int]]) -> tuple[str, int, float]:
    """`receiver`'s `engine` with `sender`'s pacing rate among `transfers` (sender -> receivers, all
    at once), from the view's bandwidths as a round's plan is paced: unpaced, a whole model overruns
    any link slower than this host's NIC and arrives only after many passes."""
    host, port = engine
    view = client.view
    if view is None or max(receiver, *transfers) >= view.size:
        return host, port, 0.0
    sources, destinations, rates = plan_flows(NetworkView.from_global(view, 1.0), transfers)
    mine = [rate for i, j, rate in zip(sources, destinations, rates) if i == sender and j == receiver]
    return host, port, float(mine[0]) if mine else 0.0


def fits(arrays: list[np.ndarray] | None, own_arrays: list[np.ndarray]) -> bool:
    """Whether a model state received (per bucket) matches this model's (a key holder could send any)."""
    return arrays is not None and len(arrays) == len(own_arrays) and all(
        a.dtype == own.dtype and a.size == own.size for a, own in zip(arrays, own_arrays))


class StateTransfer:
    """Both sides of a join: `serve` sends the model to the joiners this peer was asked to donate
    to, `receive` takes this peer's from its donor.

    Args:
        rank: this peer's.
        client, channel, sync, staging: the optimizer's control client, engine, synchronizer
            (whose clock the state carries) and host staging (whose bucket arrays are the model).
        job_ended: makes the `JobEnded` to raise once no peer is left to send the state.

    ``on_event`` is a ``Client.on_event`` callback: it runs on the client's thread, queues
    donations (``_donations``, guarded by ``_lock``) and sets ``needs_state`` or ``expelled`` (read
    by the training thread at its next step) when this peer was taken for dead.
    """

    def __init__(self, rank: int, client: ControlClient, channel: DataChannel, sync: Synchronizer,
                 staging: HostStaging, job_ended: Callable[[], JobEnded]):
        self.rank = rank
        self.client = client
        self.channel = channel
        self.sync = sync
        self.staging = staging
        self.job_ended = job_ended
        self.needs_state = False  # readmitted: the next step takes a donor's state first
        self.expelled = False     # could not register again: the next step stops
        self._donations: list[int] = []  # joiners to send the model to; guarded by _lock
        self._lock = threading.Lock()

    def on_event(self, event: Event) -> None:
        if event.kind == "donate":
            with self._lock:
                self._donations.append(int(event.rank))
        elif event.kind in ("readmitted", "expelled"):
            # Taken for dead while paused or stalled: this model is stale. Stop the round in flight;
            # the next step takes the donor's state (or stops, if the peer could not come back).
            self.needs_state = event.kind == "readmitted"
            self.expelled = event.kind == "expelled"
            self.sync.interrupt()

    def serve(self) -> None:
        """Send the model to joiners; one whose engine is not registered yet waits for next step."""
        members = self.client.members
        with self._lock:
            ready = {r: members[r].engine for r in self._donations if r in members and members[r].engine}
            self._donations = [r for r in self._donations if r not in ready and r in members]
        for rank, engine in ready.items():  # a copy: training goes on while it travels
            snapshot = self.staging.model_copy()
            self.channel.send(STATE_FLAG | self.sync.clock, snapshot,
                              [paced(self.client, self.rank, rank, engine, {self.rank: [rank]})])

    def receive(self, timeout: float = 60.0) -> None:
        """Take the model state from the donor into the model, and its round clock. Ask for another
        donation every ASK_AGAIN_S (a donor may die, or send before it learned this peer's engine),
        and at once when the donor is no longer a member, until ``timeout``; `JobEnded` as soon as
        the job ended or no donor is left."""
        client = self.client
        deadline = time.monotonic() + timeout
        donor, asked = client.donor, time.monotonic()
        while True:
            d = self.sync.take_state(donor.rank, min(deadline, time.monotonic() + STATE_POLL_S))
            if d is not None and d.msg_id != FINAL_ID and d.complete and fits(d.arrays, self.staging.bucket_arrays):
                break
            now = time.monotonic()
            if client.ended:
                raise self.job_ended()
            if now >= deadline:
                raise RuntimeError(f"rank {self.rank}: no model state from donor rank {donor.rank} within "
                                   f"{timeout:g} s; it cannot take part with a stale model")
            if donor.rank in client.members and now < asked + ASK_AGAIN_S:
                continue
            asked = now
            try:
                donor = client.ask_for_state()
            except ControlError:
                continue  # no coordinator answered just now (or the job ended: seen next): ask again later
            if donor is None:  # every other peer left: the job is ending without this one
                raise self.job_ended()
        for own, a in zip(self.staging.bucket_arrays, d.arrays):
            np.copyto(own, a.reshape(own.shape))  # the bits as sent: bfloat16 stays bfloat16
        self.staging.to_device()
        self.sync.adopt(d.msg_id & ~STATE_FLAG)
