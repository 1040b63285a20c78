"""Member and Event: the records of who is in the job and what happened to it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from . import protocol as p


@dataclass
class Member:
    """One live peer: where its data engine listens, where it would host the control plane should
    it become the coordinator's successor (``standby``), and how far it has come."""

    rank: int
    host: str
    engine: tuple[str, int] | None = None
    clock: int = 0
    loss: float | None = None
    step_time: float | None = None
    standby: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> Member:
        """A member from the wire; raises ``protocol.BadField`` on anything malformed."""
        if not isinstance(d, dict):
            raise p.BadField(f"a member must be an object, got {str(d)[:60]}")
        step_time, standby = d.get("step_time"), d.get("standby")
        return cls(rank=p.integer(d.get("rank"), "rank", 0, p.MAX_RANK), host=p.text(d.get("host"), "host"),
                   engine=p.engine_address(d.get("engine")), clock=p.integer(d.get("clock", 0), "clock"),
                   loss=p.loss_value(d.get("loss")),
                   step_time=None if step_time is None else p.number(step_time, "step_time"),
                   standby=None if standby is None else p.valid_endpoint(standby, "standby"))


@dataclass(frozen=True)
class Event:
    """Something a client was told, in ``client.events`` and passed to ``on_event`` callbacks.

    ``kind``:
    - ``"join"`` / ``"leave"`` / ``"dead"``: ``rank`` joined, left cleanly, or missed its heartbeats;
    - ``"update"``: ``rank`` registered a new data-engine address;
    - ``"donate"``: this peer is the donor: send the model state to ``rank`` at ``engine``
      through the data engine, stamped with ``clock``;
    - ``"readmitted"``: this peer was suspected dead, came back and was taken back; its model is
      stale, so the coordinator asked a donor to send it the state of round ``clock``;
    - ``"coordinator_moved"``: the coordinator died (or handed over); the client now follows the
      successor at ``endpoint``;
    - ``"coordinator_dead"``: no coordinator could be reached for the client's ``give_up``
      seconds, not even a successor; every later call raises.
    - ``"job_ended"``: the coordinator stopped at the end of the job (its owner closed it, or no
      member was left); the client looks for no successor, reports are dropped and requests raise.
    """

    kind: str
    rank: int | None = None
    engine: tuple[str, int] | None = None
    clock: int | None = None
    endpoint: str | None = None
