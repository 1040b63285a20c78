"""A network of peers: who they are and what their links carry, loss and events included."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import networkx as nx

from p2plearn.topology.event import Event
from p2plearn.topology.shipped import nearest_shipped, resolve
from p2plearn.topology.validate import TopologyError, validate

# A switch port's queue where a node gives no buffer_kb: deep enough that only real
# congestion drops packets (about 20 ms at 100 Mbit/s).
DEFAULT_BUFFER_KB = 256.0

BYTES_PER_MBIT = 1e6 / 8


class Topology:
    """A networkx graph of peers, with typed accessors for their links.

    Each node is a peer (or a host that runs ``slots`` peers) with ``uplink_mbit``,
    ``downlink_mbit``, optional ``buffer_kb`` (the queue at its switch port), ``loss`` (random
    loss rate of what it receives, in [0, 1)), ``multicast`` (false: IP multicast neither reaches
    nor leaves it, as behind a router; true by default) and optional ``events``. Without edges every
    peer hangs off one shared switch; edges, where given, say which peers are neighbours.

    Build one with ``load``, ``Topology.from_data`` or a generator in
    ``p2plearn.topology.generators``; the graph is validated on the way in.
    """

    def __init__(self, graph: nx.Graph, source: str = "<data>"):
        self.graph = graph
        self.source = source

    @classmethod
    def from_data(cls, data: dict[str, Any], source: str = "<data>") -> Topology:
        """Validate node-link ``data`` (as from ``networkx.node_link_data``) and wrap it.

        source: where the data came from, used in error messages.
        """
        validate(data, source)
        # networkx writes edges as "links" before 3.4 and "edges" since; read either.
        normalised = {
            "directed": False,
            "multigraph": False,
            "graph": data.get("graph", {}),
            "nodes": data["nodes"],
            "edges": data.get("edges", data.get("links", [])),
        }
        graph = nx.node_link_graph(normalised, directed=False, multigraph=False, edges="edges")
        return cls(graph, source)

    def to_data(self) -> dict[str, Any]:
        """Node-link data for this topology (what ``save`` writes)."""
        data = nx.node_link_data(self.graph, edges="edges")
        data["nodes"] = [{"id": node["id"], **node} for node in data["nodes"]]  # id first, for readers
        return data

    @property
    def name(self) -> str:
        """The graph's ``name`` attribute, or the file's stem."""
        return self.graph.graph.get("name") or Path(self.source).stem

    @property
    def peers(self) -> list[str]:
        """Peer names in file order (the order ranks and addresses follow)."""
        return list(self.graph.nodes)

    @property
    def has_edges(self) -> bool:
        """Whether the file names neighbours (False: all peers share one switch)."""
        return self.graph.number_of_edges() > 0

    def neighbours(self, peer: str) -> list[str]:
        """The peers ``peer`` is connected to: its graph neighbours, or all others."""
        if self.has_edges:
            return list(self.graph.neighbors(peer))
        return [other for other in self.peers if other != peer]

    def _node(self, peer: str) -> dict[str, Any]:
        if peer not in self.graph:
            raise TopologyError(f"{self.source}: no peer named {peer!r}")
        return self.graph.nodes[peer]

    def uplink_mbit(self, peer: str) -> float:
        """Rate ``peer`` can send at, in Mbit/s."""
        return float(self._node(peer)["uplink_mbit"])

    def downlink_mbit(self, peer: str) -> float:
        """Rate ``peer`` can receive at, in Mbit/s."""
        return float(self._node(peer)["downlink_mbit"])

    def uplink_bytes_per_s(self, peer: str) -> float:
        """Rate ``peer`` can send at, in bytes/s."""
        return self.uplink_mbit(peer) * BYTES_PER_MBIT

    def downlink_bytes_per_s(self, peer: str) -> float:
        """Rate ``peer`` can receive at, in bytes/s."""
        return self.downlink_mbit(peer) * BYTES_PER_MBIT

    def buffer_kb(self, peer: str) -> float:
        """Queue at ``peer``'s switch port in KiB (DEFAULT_BUFFER_KB where not given)."""
        return float(self._node(peer).get("buffer_kb", DEFAULT_BUFFER_KB))

    def buffer_bytes(self, peer: str) -> int:
        """Queue at ``peer``'s switch port in bytes."""
        return int(self.buffer_kb(peer) * 1024)

    def loss(self, peer: str) -> float:
        """Random loss rate of what ``peer`` receives, in [0, 1)."""
        return float(self._node(peer).get("loss", 0.0))

    def multicast(self, peer: str) -> bool:
        """Whether IP multicast reaches ``peer`` and leaves it (false: as behind a router)."""
        return bool(self._node(peer).get("multicast", True))

    def slots(self, peer: str) -> int:
        """How many peer processes this node's host runs (1 unless given)."""
        return int(self._node(peer).get("slots", 1))

    def events(self, peer: str) -> list[Event]:
        """Scheduled changes of ``peer``'s link, as given in the file."""
        return [Event.from_data(event) for event in self._node(peer).get("events", [])]

    def base_link(self, peer: str) -> dict[str, float]:
        """The values events override and then restore: rates, buffer and loss."""
        return {
            "uplink_mbit": self.uplink_mbit(peer),
            "downlink_mbit": self.downlink_mbit(peer),
            "buffer_kb": self.buffer_kb(peer),
            "loss": self.loss(peer),
        }


def load(path: str | os.PathLike) -> Topology:
    """Read and validate a node-link JSON topology file: a path, or a shipped topology's name
    (``heterogeneous-4``, ``topology/heterogeneous-4.json`` from any directory: see ``shipped.resolve``)."""
    source = os.fspath(path)
    try:
        with open(resolve(path), encoding="utf-8") as file:
            data = json.load(file)
    except OSError as error:
        raise TopologyError(f"{source}: cannot read: {error.strerror}{nearest_shipped(path)}") from None
    except json.JSONDecodeError as error:
        raise TopologyError(f"{source}: not JSON: {error}") from None
    return Topology.from_data(data, source)


def save(topology: Topology, path: str | os.PathLike) -> None:
    """Write ``topology`` as indented node-link JSON (stable, diff-friendly)."""
    with open(path, "w", encoding="utf-8") as file:
        json.dump(topology.to_data(), file, indent=2)
        file.write("\n")
