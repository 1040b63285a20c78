"""A scheduled change of one peer's link: a microburst or a congestion episode."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

# The link properties an event may change while it is active.
CHANGE_FIELDS = ("uplink_mbit", "downlink_mbit", "buffer_kb", "loss")


@dataclass(frozen=True)
class Event:
    """A change to one peer's link, undone when it ends.

    at_s: seconds after the network comes up at which the first occurrence starts.
    duration_s: how long each occurrence lasts; the link then returns to the peer's base
        values. Microbursts are tens to hundreds of milliseconds; congestion episodes seconds.
    changes: the values that replace the peer's base values while active, any of
        ``uplink_mbit``, ``downlink_mbit``, ``buffer_kb`` and ``loss``.
    every_s: repeat period in seconds (None: happens once). Must exceed ``duration_s``;
        shorter periods make the bursts more frequent.
    until_s: no occurrence starts at or after this time (None: repeats for as long as the
        network is up).
    """

    at_s: float
    duration_s: float
    changes: dict[str, float] = field(default_factory=dict)
    every_s: float | None = None
    until_s: float | None = None

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Event:
        """Build from a validated JSON object (see ``p2plearn.topology.validate``)."""
        return cls(
            at_s=float(data["at_s"]),
            duration_s=float(data["duration_s"]),
            changes={name: float(data[name]) for name in CHANGE_FIELDS if name in data},
            every_s=None if data.get("every_s") is None else float(data["every_s"]),
            until_s=None if data.get("until_s") is None else float(data["until_s"]),
        )

    def to_data(self) -> dict[str, Any]:
        """The JSON object this event is stored as."""
        data: dict[str, Any] = {"at_s": self.at_s, "duration_s": self.duration_s}
        if self.every_s is not None:
            data["every_s"] = self.every_s
        if self.until_s is not None:
            data["until_s"] = self.until_s
        data.update(self.changes)
        return data

    def occurrences(self, horizon_s: float = math.inf) -> Iterator[tuple[float, float]]:
        """(start_s, end_s) of each occurrence that starts before ``horizon_s``, in time order."""
        last_start = min(horizon_s, math.inf if self.until_s is None else self.until_s)
        starts = (
            itertools.count(self.at_s, self.every_s) if self.every_s is not None else [self.at_s]
        )
        for start in starts:
            if start >= last_start:
                return
            yield start, start + self.duration_s
