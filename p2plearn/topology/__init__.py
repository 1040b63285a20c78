"""Topologies: networks of peers with link rates, buffers, loss and scheduled events.

Files are networkx node-link JSON (see ``topology/`` at the repository root)::

    {"graph": {"name": "two"},
     "nodes": [{"id": "p0", "uplink_mbit": 100, "downlink_mbit": 100, "buffer_kb": 64,
                "loss": 0.01,
                "events": [{"at_s": 5, "duration_s": 0.2, "every_s": 10, "loss": 0.3}]},
               {"id": "p1", "uplink_mbit": 50, "downlink_mbit": 200}],
     "edges": []}

``load`` also takes a shipped topology's name (``heterogeneous-4``), from any directory.
``python -m p2plearn.topology generate`` rewrites the standard files; ``check FILE...``
validates files.
"""

from p2plearn.topology.event import CHANGE_FIELDS, Event
from p2plearn.topology.generators import STANDARD, heterogeneous, homogeneous, incast, microburst
from p2plearn.topology.shipped import SHIPPED_DIR, nearest_shipped, resolve, shipped_names
from p2plearn.topology.topology import DEFAULT_BUFFER_KB, Topology, load, save
from p2plearn.topology.validate import TopologyError, validate

__all__ = [
    "CHANGE_FIELDS",
    "DEFAULT_BUFFER_KB",
    "Event",
    "SHIPPED_DIR",
    "STANDARD",
    "Topology",
    "TopologyError",
    "heterogeneous",
    "homogeneous",
    "incast",
    "load",
    "microburst",
    "nearest_shipped",
    "resolve",
    "save",
    "shipped_names",
    "validate",
]
