"""Progress: what the launcher shows of a running job, carried by every coordinator tick."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import protocol as p


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

    def to_dict(self) -> dict[str, Any]:
        return {"min_clock": self.min_clock, "max_clock": self.max_clock, "alive": self.alive,
                "loss": self.loss, "slowest": self.slowest}

    @classmethod
    def from_dict(cls, d: Any) -> Progress:
        """From a tick; raises ``protocol.BadField`` on anything malformed."""
        if not isinstance(d, dict):
            raise p.BadField(f"progress must be an object, got {str(d)[:60]}")
        slowest = d.get("slowest")
        return cls(min_clock=p.integer(d.get("min_clock"), "min_clock"),
                   max_clock=p.integer(d.get("max_clock"), "max_clock"),
                   alive=p.integer(d.get("alive"), "alive", 0, p.MAX_RANK + 1), loss=p.loss_value(d.get("loss")),
                   slowest=None if slowest is None else p.integer(slowest, "slowest", 0, p.MAX_RANK))
