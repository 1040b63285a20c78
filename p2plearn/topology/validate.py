"""Checks a topology's JSON data before anything uses it, with errors that say where.

Every error names the file (or ``<data>``), the node and the field, e.g.
``heterogeneous-8.json: node 'p3': field 'loss': 1.5 is outside [0, 1)``.
"""

from __future__ import annotations

import math
from typing import Any

from p2plearn.topology.event import CHANGE_FIELDS, Event

TOP_LEVEL_KEYS = {"directed", "multigraph", "graph", "nodes", "edges", "links"}
GRAPH_KEYS = {"name", "description"}
NODE_KEYS = {"id", "uplink_mbit", "downlink_mbit", "buffer_kb", "loss", "slots", "events", "multicast"}
EDGE_KEYS = {"source", "target"}
EVENT_KEYS = {"at_s", "duration_s", "every_s", "until_s", *CHANGE_FIELDS}

# Periodic events are compared for overlap over this many periods of the longest one.
OVERLAP_CHECK_PERIODS = 1000


class TopologyError(ValueError):
    """A topology file or data that cannot be used; the message says where and why."""


def validate(data: Any, source: str = "<data>") -> None:
    """Raise TopologyError on the first problem in node-link ``data`` read from ``source``."""
    if not isinstance(data, dict):
        raise TopologyError(f"{source}: expected a JSON object (networkx node-link data)")
    _check_keys(data, TOP_LEVEL_KEYS, source)
    if data.get("directed", False) or data.get("multigraph", False):
        raise TopologyError(f"{source}: 'directed' and 'multigraph' must be false")
    graph = data.get("graph", {})
    if not isinstance(graph, dict):
        raise TopologyError(f"{source}: 'graph' must be an object")
    _check_keys(graph, GRAPH_KEYS, f"{source}: graph")
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise TopologyError(f"{source}: 'nodes' must be a non-empty list")
    names: set[str] = set()
    for index, node in enumerate(nodes):
        name = _check_node(node, index, source)
        if name in names:
            raise TopologyError(f"{source}: node {name!r}: duplicate name")
        names.add(name)
    edges = data.get("edges", data.get("links", []))
    if not isinstance(edges, list):
        raise TopologyError(f"{source}: 'edges' must be a list")
    for index, edge in enumerate(edges):
        _check_edge(edge, index, names, source)


def _check_keys(obj: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise TopologyError(
            f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})"
        )


def _check_node(node: Any, index: int, source: str) -> str:
    if not isinstance(node, dict):
        raise TopologyError(f"{source}: node #{index}: expected an object")
    name = node.get("id")
    if not isinstance(name, str) or not name:
        raise TopologyError(f"{source}: node #{index}: field 'id': must be a non-empty string")
    where = f"{source}: node {name!r}"
    _check_keys(node, NODE_KEYS, where)
    for rate in ("uplink_mbit", "downlink_mbit"):
        if rate not in node:
            raise TopologyError(f"{where}: missing field {rate!r}")
    _check_link_values(node, where)
    slots = node.get("slots", 1)
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise TopologyError(f"{where}: field 'slots': {slots!r} is not a positive integer")
    if not isinstance(node.get("multicast", True), bool):
        raise TopologyError(f"{where}: field 'multicast': {node['multicast']!r} is not true or false")
    events = node.get("events", [])
    if not isinstance(events, list):
        raise TopologyError(f"{where}: field 'events': must be a list")
    for event_index, event in enumerate(events):
        _check_event(event, f"{where}: event #{event_index}")
    _check_overlaps([Event.from_data(event) for event in events], where)
    return name


def _check_link_values(obj: dict, where: str) -> None:
    """Rates and buffers must be positive numbers, loss a rate in [0, 1)."""
    for name in ("uplink_mbit", "downlink_mbit", "buffer_kb"):
        if name in obj and _number(obj[name], name, where) <= 0:
            raise TopologyError(f"{where}: field {name!r}: {obj[name]!r} must be positive")
    if "loss" in obj and not 0 <= _number(obj["loss"], "loss", where) < 1:
        raise TopologyError(f"{where}: field 'loss': {obj['loss']!r} is outside [0, 1)")


def _number(value: Any, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TopologyError(f"{where}: field {name!r}: {value!r} is not a finite number")
    return float(value)


def _check_event(event: Any, where: str) -> None:
    if not isinstance(event, dict):
        raise TopologyError(f"{where}: expected an object")
    _check_keys(event, EVENT_KEYS, where)
    for name in ("at_s", "duration_s"):
        if name not in event:
            raise TopologyError(f"{where}: missing field {name!r}")
    if _number(event["at_s"], "at_s", where) < 0:
        raise TopologyError(f"{where}: field 'at_s': {event['at_s']!r} must not be negative")
    if _number(event["duration_s"], "duration_s", where) <= 0:
        raise TopologyError(f"{where}: field 'duration_s': {event['duration_s']!r} must be positive")
    every = event.get("every_s")
    if every is not None and _number(every, "every_s", where) <= event["duration_s"]:
        raise TopologyError(f"{where}: field 'every_s': {every!r} must exceed duration_s")
    until = event.get("until_s")
    if until is not None and _number(until, "until_s", where) <= event["at_s"]:
        raise TopologyError(f"{where}: field 'until_s': {until!r} must exceed at_s")
    if not any(name in event for name in CHANGE_FIELDS):
        raise TopologyError(f"{where}: changes nothing (give any of {', '.join(CHANGE_FIELDS)})")
    _check_link_values(event, where)


def _check_overlaps(events: list[Event], where: str) -> None:
    """Events of one node may not be active at once: each restores the base values."""
    periods = [event.every_s for event in events if event.every_s is not None]
    horizon = max((event.at_s for event in events), default=0.0)
    horizon += OVERLAP_CHECK_PERIODS * max(periods, default=0.0) + 1.0
    occurrences = sorted(
        (start, end, index)
        for index, event in enumerate(events)
        for start, end in event.occurrences(horizon)
    )
    latest_end, latest_index = -math.inf, -1
    for start, end, index in occurrences:
        if start < latest_end:
            first, second = sorted((latest_index, index))
            raise TopologyError(
                f"{where}: events #{first} and #{second} overlap (at {start:g} s)"
            )
        if end > latest_end:
            latest_end, latest_index = end, index


def _check_edge(edge: Any, index: int, names: set[str], source: str) -> None:
    where = f"{source}: edge #{index}"
    if not isinstance(edge, dict):
        raise TopologyError(f"{where}: expected an object")
    _check_keys(edge, EDGE_KEYS, where)
    for end in ("source", "target"):
        if edge.get(end) not in names:
            raise TopologyError(f"{where}: unknown node {edge.get(end)!r} in field {end!r}")
