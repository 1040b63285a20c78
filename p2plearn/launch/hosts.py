"""Hosts and slots: ``-H`` lists, mpirun-style hostfiles, and the rank -> host placement."""

from __future__ import annotations

import socket
from dataclasses import dataclass


class HostError(ValueError):
    """A host list or hostfile is wrong; the message says what and where."""


@dataclass(frozen=True)
class Host:
    """A host with ``slots`` peers; ``where`` names its origin (``-H`` or ``file:line``) for errors."""

    name: str
    slots: int
    where: str

    @property
    def local(self) -> bool:
        return is_local(self.name)


@dataclass(frozen=True)
class Slot:
    """Where one rank runs."""

    rank: int
    host: Host
    local_rank: int
    local_world_size: int


def is_local(name: str) -> bool:
    """True for this machine's names (these entries run without ssh)."""
    return name in {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()}


def parse_host_list(spec: str) -> list[Host]:
    """``-H host1:4,host2:4,host3`` (no count: one slot)."""
    hosts = []
    for item in spec.split(","):
        name, _, count = item.strip().partition(":")
        if not name:
            raise HostError(f"-H {spec}: empty host name")
        hosts.append(Host(name, _slots(count or "1", f"-H {spec}: host {name!r}"), "-H"))
    return _merge(hosts)


def parse_hostfile(path: str) -> list[Host]:
    """mpirun syntax: ``host [slots=N] [max_slots=N]`` per line; ``#`` comments, blank lines."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise HostError(f"hostfile {path}: {exc.strerror}") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        where = f"{path}:{number}"
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = 1
        for word in words[1:]:
            key, eq, value = word.partition("=")
            if key == "slots" and eq:
                slots = _slots(value, f"{where}: slots")
            elif key == "max_slots" and eq:
                _slots(value, f"{where}: max_slots")  # accepted for compatibility; slots decides
            else:
                raise HostError(f"{where}: unknown field {word!r} (expected slots=N)")
        hosts.append(Host(words[0], slots, where))
    if not hosts:
        raise HostError(f"hostfile {path}: no hosts")
    return _merge(hosts)


def place(hosts: list[Host], np: int, oversubscribe: bool = False) -> list[Slot]:
    """Ranks by slot, filling each host in order (mpirun's default ``--map-by slot``)."""
    total = sum(h.slots for h in hosts)
    if np > total and not oversubscribe:
        raise HostError(f"-np {np} needs {np} slots but the hosts give {total} (add slots or --oversubscribe)")
    order = [h for h in hosts for _ in range(h.slots)]
    chosen = [order[r % total] for r in range(np)]
    counts = {h.name: chosen.count(h) for h in hosts}
    seen: dict[str, int] = {}
    slots = []
    for rank, host in enumerate(chosen):
        slots.append(Slot(rank, host, seen.get(host.name, 0), counts[host.name]))
        seen[host.name] = seen.get(host.name, 0) + 1
    return slots


def _slots(value: str, where: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise HostError(f"{where}: slot count {value!r} is not a positive integer")
    return int(value)


def _merge(hosts: list[Host]) -> list[Host]:
    """A host named twice gets the sum of its slots (as mpirun does), at its first position."""
    merged: dict[str, Host] = {}
    for h in hosts:
        first = merged.get(h.name)
        merged[h.name] = Host(h.name, h.slots + (first.slots if first else 0), first.where if first else h.where)
    return list(merged.values())
