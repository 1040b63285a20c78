"""The coordinator's reading of request fields that are more than one value: a registration's
hand-over and link rate, and a report's flows, load and counters. Each is checked whole before the
membership table sees it; what a peer cannot vouch for (a flow to no rank, a negative load) is left
out rather than refused, so that the rest of a report still counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import protocol as p
from .membership import Member
from .view import FLOOR, GlobalView

LOAD = ("compute_s", "merge_s", "backlog", "in_flight_bytes", "in_flight_msgs")  # per peer, from its reports
MAX_COUNTS = 32  # counters a report carries at most (a peer sends the send results cut short and its engine's drops)


@dataclass(frozen=True)
class Resume:
    """A re-registration's hand-over to a successor (``Client._resume``): the clock and epoch its
    sender had reached, the members and the view it held."""

    clock: int
    epoch: int
    members: list[Member]
    view: GlobalView | None


def read_rank(value: Any) -> int:
    return p.integer(value, "rank", 0, p.MAX_RANK)


def read_resume(value: Any, blobs: list[bytes]) -> Resume | None:
    """A registration's ``resume`` (with the request's blobs: the view's arrays); None: no hand-over.
    Raises ``protocol.BadField`` on anything malformed."""
    if not value:
        return None
    if not isinstance(value, dict):
        raise p.BadField(f"resume must be an object, got {str(value)[:60]}")
    members = value.get("members", [])
    if not isinstance(members, list) or len(members) > p.MAX_RANK:
        raise p.BadField("resume members must be a list of members")
    view = GlobalView.from_blobs(value["view"], blobs) if value.get("view") else None
    counts = {name: p.integer(value.get(name, 0), f"resume {name}") for name in ("clock", "epoch")}
    return Resume(clock=counts["clock"], epoch=counts["epoch"], members=[Member.from_dict(d) for d in members],
                  view=view)


def read_links(value: Any) -> dict[int, dict[str, Any]]:
    """A report's ``links`` (see ``Client.report``): the flows whose receiver is a rank and whose
    ``rate`` and ``paced`` are numbers in [0, MAX_RATE); any other flow says nothing and is left
    out, as ``read_load`` leaves out a load it cannot use (the report's clock still counts)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise p.BadField("links must be an object")
    links = {}
    for receiver, flow in value.items():
        if not (receiver.isascii() and receiver.isdigit() and int(receiver) < p.MAX_RANK and isinstance(flow, dict)):
            continue
        rate, paced = flow.get("rate", 0.0), flow.get("paced", 0.0)
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < p.MAX_RATE for x in (rate, paced)):
            probe = str(flow.get("probe", ""))[:32]
            links[int(receiver)] = {"rate": float(rate), "paced": float(paced), "probe": probe,
                                    "multicast": flow.get("multicast") is True}
    return links


def read_load(value: Any) -> dict[str, float]:
    """A peer's reported load: the LOAD entries that are finite numbers >= 0 (else 0: nothing known),
    those below their unit's floor (``view.FLOOR``) as 0. Below it a load is noise, and noise that
    enters a plan is read as a difference: a peer whose published merge time was 0.5 ms, the others'
    0 (a new view takes everyone's current load, a load changing by less than the floor makes none),
    could merge no message by a T of microseconds, and SELMCAST left it without senders for good."""
    out = {}
    for name in LOAD:
        try:
            x = float((value or {}).get(name, 0.0))
        except (TypeError, ValueError, AttributeError, OverflowError):
            x = 0.0
        out[name] = x if FLOOR.get(name, 0.0) <= x < float("inf") else 0.0
    return out


def read_counts(value: Any) -> dict[str, int]:
    """A report's ``counts`` (its peer's counters over the job, for the monitor): at most
    ``MAX_COUNTS`` names of up to 32 letters, digits or underscores, each an integer >= 0; any other
    entry is left out."""
    if not isinstance(value, dict):
        return {}
    return {name: n for name, n in list(value.items())[:MAX_COUNTS]
            if isinstance(name, str) and len(name) <= 32 and name.replace("_", "a").isalnum() and name.isascii()
            and isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**63}


def read_link_rate(value: Any) -> float | None:
    """A registering peer's interface rate: bytes/s if a positive finite number (< 100 Tbit/s), else unknown."""
    try:
        rate = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return rate if 0 < rate < p.MAX_RATE else None
