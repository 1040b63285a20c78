"""`FinalAverage`: the peers' models averaged at one of them once training ends
(`DecentralizedOptimizer.average_model`).

Each peer sends its whole model (message id ``FINAL_ID``) to the first live rank from the root on
and leaves the job once the root's engine acknowledged it whole; the first peer that reaches itself
in that order is the root: it leaves too, takes the models until no member is left that could still
send one, and returns once the senders whose models it took have left (ANSWER_LINGER_S at most),
its engine answering them until then. Leaving matters: peers still training (a late one: paused and
readmitted, its clock ahead of the others') neither wait for a finished peer's rounds nor are held
back by its clock, so the root never waits on a peer waiting for it.

Tuning: ``timeout`` (of `average`) bounds both a send to a root and the root's wait; a root that
runs out names the ranks missing and averages what came.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch

from p2plearn.control import ControlError
from p2plearn.control.membership import Event
from p2plearn.protocols import ControlClient, DataChannel
from p2plearn.sync import Synchronizer
from p2plearn.sync.bfloat16 import bf16_values, values
from p2plearn.sync.inbox import MAX_STATES
from p2plearn.train.layout import ModelLayout
from p2plearn.train.staging import HostStaging
from p2plearn.train.state_transfer import FINAL_ID, fits, paced
from p2plearn.transport import ANSWER_LINGER_S

log = logging.getLogger("p2plearn.train")


class FinalAverage:
    """This peer's part in the final average, as sender or root.

    Args:
        rank, world_size: this peer's rank, and the job's size (the root keeps a model from each).
        client, channel, sync, staging, layout: the optimizer's control client, engine,
            synchronizer (whose inbox files the models), host staging (this peer's model, per
            bucket) and model layout (how the buckets become named tensors).

    ``on_event`` is a ``Client.on_event`` callback (the client's thread): it keeps each rank's last
    engine address and the ranks last heard of as dead, so a final model goes to a root that left
    the job (it is averaging), never to one known dead. ``averaged_from`` holds the ranks the root
    averaged.
    """

    def __init__(self, rank: int, world_size: int, client: ControlClient, channel: DataChannel,
                 sync: Synchronizer, staging: HostStaging, layout: ModelLayout):
        self.rank = rank
        self.client = client
        self.channel = channel
        self.sync = sync
        self.staging = staging
        self.layout = layout
        self._engines = {r: m.engine for r, m in client.members.items() if m.engine}  # written by on_event
        self._dead: set[int] = set()  # written by on_event
        self.averaged_from: list[int] = []
        sync.keep_states(max(MAX_STATES, world_size))

    def on_event(self, event: Event) -> None:
        if event.kind in ("join", "update") and event.engine:
            self._engines[event.rank] = event.engine
            self._dead.discard(event.rank)
        elif event.kind == "dead":
            self._dead.add(event.rank)

    def average(self, root: int, timeout: float) -> dict[str, torch.Tensor] | None:
        """Send this peer's model to the root, or be the root and average (see the module's
        docstring); the average by state-dict name on the root, None elsewhere. A send to a dead
        candidate costs the engine's 3 s of silence, none once its death is known."""
        until = time.monotonic() + timeout
        engines = {**self._engines, **{r: m.engine for r, m in self.client.members.items() if m.engine}}
        for candidate in sorted({*engines, self.rank}, key=lambda r: (r < root, r)):
            if candidate == self.rank:
                self._leave()
                return self._gather(until)
            if candidate in self._dead and candidate not in self.client.members:
                continue
            if self._send_final(candidate, engines[candidate], until):
                self._leave()
                return None
        self._leave()  # no peer took it (all gone): this peer's model is the average
        return self._gather(until)

    def _send_final(self, receiver: int, engine: tuple[str, int], until: float) -> bool:
        """Send this peer's model to `receiver`; whether its engine took it all."""
        members = self.client.members
        gather = {r: [receiver] for r in {*members, self.rank} if r != receiver}
        handle = self.channel.send(FINAL_ID, self.staging.model_copy(), [paced(self.client, self.rank, receiver,
                                                                              engine, gather)])
        try:
            (sent,) = handle.wait(max(0.0, until - time.monotonic()))
        except TimeoutError:
            return False
        return sent.result in ("exact", "duplicate")  # duplicate: it had this message already

    def _leave(self) -> None:
        """Leave the job's membership: no peer plans with this one, waits for it or on its clock."""
        try:
            self.client.leave()
        except ControlError:
            pass  # no coordinator answered: the others find this peer gone by its silence

    def _gather(self, until: float) -> dict[str, torch.Tensor]:
        """The root's part: the final models of every member still in the job (and those already
        sent), averaged with this peer's own in rank order (the same sum whatever the arrival order)."""
        models: dict[int, list[np.ndarray]] = {}
        while True:
            # Members are peers still training or sending; one that left has sent its model (to the
            # first live candidate): it is in the engine's queue by now, or went to another root.
            missing = set(self.client.members) - set(models) - {self.rank}
            d = self.sync.take_state(None, 0.0)
            if d is None:
                if not missing:
                    break
                if time.monotonic() >= until:
                    log.warning("p2plearn rank %d: rank(s) %s sent no model within the final average's timeout; "
                                "averaging the %d that came", self.rank, sorted(missing), len(models) + 1)
                    break
                d = self.sync.take_state(None, min(until, time.monotonic() + 0.1))
            if d is not None and d.msg_id == FINAL_ID and d.complete and fits(d.arrays, self.staging.bucket_arrays):
                models[d.sender] = d.arrays
        # A sender leaves once its engine heard that this one took its model; until then this engine
        # answers. Stopped at once (the optimizer's close), a sender whose acknowledgements were lost
        # would hear silence, give this root up and send its model to the next candidate, or to itself.
        self.client.wait_left(models, ANSWER_LINGER_S)
        self.averaged_from = sorted({*models, self.rank})
        total = [torch.from_numpy(values(a)).double() for a in self.staging.model_copy()]
        for rank in sorted(models):
            for t, a, f in zip(total, models[rank], self.layout.buckets.flats):
                t += torch.from_numpy(bf16_values(a) if f.dtype == torch.bfloat16 else a)
        n = len(models) + 1
        return self.layout.unpack([t / n for t in total])
