"""Loading, saving and the typed accessors of p2plearn.topology."""

import json
from pathlib import Path

import networkx as nx
import pytest

from p2plearn.topology import DEFAULT_BUFFER_KB, STANDARD, Event, Topology, load, save

REPOSITORY_TOPOLOGIES = Path(__file__).resolve().parents[2] / "topology"

DATA = {
    "graph": {"name": "two"},
    "nodes": [
        {
            "id": "a",
            "uplink_mbit": 100,
            "downlink_mbit": 200,
            "buffer_kb": 64,
            "loss": 0.01,
            "slots": 2,
            "events": [{"at_s": 1, "duration_s": 0.5, "every_s": 2, "loss": 0.3}],
        },
        {"id": "b", "uplink_mbit": 50, "downlink_mbit": 25},
    ],
}


def test_accessors_convert_units_and_fill_defaults():
    topology = Topology.from_data(DATA)
    assert topology.name == "two"
    assert topology.peers == ["a", "b"]
    assert topology.uplink_mbit("a") == 100.0
    assert topology.uplink_bytes_per_s("a") == 12.5e6
    assert topology.downlink_bytes_per_s("b") == 25e6 / 8
    assert topology.buffer_kb("a") == 64 and topology.buffer_bytes("a") == 64 * 1024
    assert topology.buffer_kb("b") == DEFAULT_BUFFER_KB
    assert topology.loss("a") == 0.01 and topology.loss("b") == 0.0
    assert topology.slots("a") == 2 and topology.slots("b") == 1
    assert topology.events("a") == [Event(1.0, 0.5, {"loss": 0.3}, every_s=2.0)]
    assert topology.events("b") == []
    assert topology.base_link("b") == {
        "uplink_mbit": 50.0, "downlink_mbit": 25.0, "buffer_kb": DEFAULT_BUFFER_KB, "loss": 0.0
    }
    assert isinstance(topology.graph, nx.Graph)


def test_without_edges_everyone_is_a_neighbour():
    topology = Topology.from_data({"nodes": DATA["nodes"] + [{"id": "c", "uplink_mbit": 1, "downlink_mbit": 1}]})
    assert not topology.has_edges
    assert topology.neighbours("a") == ["b", "c"]
    with_edges = Topology.from_data({**topology.to_data(), "edges": [{"source": "a", "target": "c"}]})
    assert with_edges.has_edges
    assert with_edges.neighbours("a") == ["c"] and with_edges.neighbours("b") == []


def test_save_then_load_round_trips(tmp_path):
    path = tmp_path / "two.json"
    save(Topology.from_data(DATA), path)
    loaded = load(path)
    assert loaded.source == str(path)
    assert loaded.to_data() == Topology.from_data(DATA).to_data()
    assert json.loads(path.read_text())["nodes"][0]["id"] == "a"


def test_accepts_networkx_links_key():
    data = {"nodes": DATA["nodes"], "links": [{"source": "a", "target": "b"}]}
    assert Topology.from_data(data).neighbours("b") == ["a"]


def test_event_occurrences_repeat_until_the_horizon_or_until_s():
    event = Event(1.0, 0.5, {"loss": 0.2}, every_s=2.0)
    assert list(event.occurrences(6.0)) == [(1.0, 1.5), (3.0, 3.5), (5.0, 5.5)]
    bounded = Event(1.0, 0.5, {"loss": 0.2}, every_s=2.0, until_s=4.0)
    assert list(bounded.occurrences()) == [(1.0, 1.5), (3.0, 3.5)]
    assert list(Event(2.0, 1.0, {"loss": 0.2}).occurrences()) == [(2.0, 3.0)]
    assert Event.from_data(bounded.to_data()) == bounded


@pytest.mark.parametrize("stem", sorted(STANDARD))
def test_shipped_files_load_and_match_their_generator(stem):
    path = REPOSITORY_TOPOLOGIES / f"{stem}.json"
    assert load(path).to_data() == STANDARD[stem]().to_data(), (
        f"{path} is stale: run python -m p2plearn.topology generate"
    )
