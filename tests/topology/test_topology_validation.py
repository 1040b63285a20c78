"""Every validation error names the file, the node and the field."""

import copy
import json

import pytest

from p2plearn.topology import Topology, TopologyError, load


def valid():
    return {
        "nodes": [
            {"id": "a", "uplink_mbit": 100, "downlink_mbit": 100},
            {"id": "b", "uplink_mbit": 50, "downlink_mbit": 200, "buffer_kb": 48, "loss": 0.01,
             "events": [{"at_s": 1, "duration_s": 0.5, "loss": 0.2}]},
        ],
        "edges": [],
    }


def with_node_b(**changes):
    data = valid()
    data["nodes"][1].update(changes)
    return data


def with_event(**changes):
    data = valid()
    data["nodes"][1]["events"][0].update(changes)
    return data


def without(field):
    data = valid()
    del data["nodes"][1][field]
    return data


CASES = {
    "unknown node key": (with_node_b(uplink=5), "node 'b': unknown key 'uplink'"),
    "missing uplink": (without("uplink_mbit"), "node 'b': missing field 'uplink_mbit'"),
    "missing downlink": (without("downlink_mbit"), "node 'b': missing field 'downlink_mbit'"),
    "negative rate": (with_node_b(uplink_mbit=-1), "node 'b': field 'uplink_mbit': -1 must be positive"),
    "zero rate": (with_node_b(downlink_mbit=0), "node 'b': field 'downlink_mbit': 0 must be positive"),
    "text rate": (with_node_b(uplink_mbit="fast"), "node 'b': field 'uplink_mbit': 'fast' is not a finite number"),
    "boolean rate": (with_node_b(uplink_mbit=True), "node 'b': field 'uplink_mbit': True is not a finite number"),
    "infinite rate": (with_node_b(uplink_mbit=float("inf")), "field 'uplink_mbit': inf is not a finite number"),
    "negative buffer": (with_node_b(buffer_kb=-4), "node 'b': field 'buffer_kb': -4 must be positive"),
    "loss of one": (with_node_b(loss=1), "node 'b': field 'loss': 1 is outside [0, 1)"),
    "negative loss": (with_node_b(loss=-0.1), "node 'b': field 'loss': -0.1 is outside [0, 1)"),
    "multicast not a bool": (with_node_b(multicast="no"), "node 'b': field 'multicast': 'no' is not true or false"),
    "text loss": (with_node_b(loss="5%"), "node 'b': field 'loss': '5%' is not a finite number"),
    "bad slots": (with_node_b(slots=0), "node 'b': field 'slots': 0 is not a positive integer"),
    "events not a list": (with_node_b(events={}), "node 'b': field 'events': must be a list"),
    "unknown event key": (with_event(rate=5), "node 'b': event #0: unknown key 'rate'"),
    "event without start": (with_node_b(events=[{"duration_s": 1, "loss": 0.1}]), "node 'b': event #0: missing field 'at_s'"),
    "negative event start": (with_event(at_s=-1), "node 'b': event #0: field 'at_s': -1 must not be negative"),
    "zero event duration": (with_event(duration_s=0), "node 'b': event #0: field 'duration_s': 0 must be positive"),
    "period not above duration": (with_event(every_s=0.5), "node 'b': event #0: field 'every_s': 0.5 must exceed duration_s"),
    "until before start": (with_event(every_s=2, until_s=1), "node 'b': event #0: field 'until_s': 1 must exceed at_s"),
    "event changes nothing": (with_node_b(events=[{"at_s": 1, "duration_s": 1}]), "node 'b': event #0: changes nothing"),
    "event bad loss": (with_event(loss=2), "node 'b': event #0: field 'loss': 2 is outside [0, 1)"),
    "event negative rate": (with_event(downlink_mbit=-5), "node 'b': event #0: field 'downlink_mbit': -5 must be positive"),
    "overlapping events": (
        with_node_b(events=[{"at_s": 1, "duration_s": 2, "loss": 0.1}, {"at_s": 2, "duration_s": 1, "uplink_mbit": 1}]),
        "node 'b': events #0 and #1 overlap (at 2 s)",
    ),
    "periodic events that overlap later": (
        with_node_b(events=[{"at_s": 0, "duration_s": 1, "every_s": 10, "loss": 0.1},
                            {"at_s": 30.5, "duration_s": 1, "loss": 0.2}]),
        "node 'b': events #0 and #1 overlap (at 30.5 s)",
    ),
    "duplicate names": ({"nodes": [valid()["nodes"][0], valid()["nodes"][0]]}, "node 'a': duplicate name"),
    "node without id": ({"nodes": [{"uplink_mbit": 1, "downlink_mbit": 1}]}, "node #0: field 'id': must be a non-empty string"),
    "node not an object": ({"nodes": [5]}, "node #0: expected an object"),
    "no nodes": ({"nodes": []}, "'nodes' must be a non-empty list"),
    "unknown top-level key": ({**valid(), "peers": []}, "unknown key 'peers'"),
    "unknown graph key": ({**valid(), "graph": {"nmae": "x"}}, "graph: unknown key 'nmae'"),
    "directed": ({**valid(), "directed": True}, "'directed' and 'multigraph' must be false"),
    "edge to unknown node": ({**valid(), "edges": [{"source": "a", "target": "z"}]}, "edge #0: unknown node 'z'"),
    "edge unknown key": ({**valid(), "edges": [{"source": "a", "target": "b", "mbit": 5}]}, "edge #0: unknown key 'mbit'"),
    "not an object": ([], "expected a JSON object"),
}


def test_the_valid_base_case_is_valid():
    Topology.from_data(valid())


def test_non_overlapping_periodic_events_are_accepted():
    Topology.from_data(with_node_b(events=[
        {"at_s": 0, "duration_s": 1, "every_s": 10, "loss": 0.1},
        {"at_s": 5, "duration_s": 1, "every_s": 10, "uplink_mbit": 10},
    ]))


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_names_file_node_and_field(case, tmp_path):
    data, message = CASES[case]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TopologyError) as error:
        load(path)
    assert str(error.value).startswith(f"{path}: ")
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_from_data_names_its_source_and_is_a_value_error():
    with pytest.raises(ValueError, match=r"^<data>: node 'b': field 'loss'"):
        Topology.from_data(with_node_b(loss=1.5))
    with pytest.raises(TopologyError, match=r"^mine: "):
        Topology.from_data(with_node_b(loss=1.5), source="mine")


def test_unreadable_and_non_json_files(tmp_path):
    with pytest.raises(TopologyError, match="missing.json: cannot read"):
        load(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{nodes")
    with pytest.raises(TopologyError, match="broken.json: not JSON"):
        load(tmp_path / "broken.json")


def test_validation_does_not_modify_the_data():
    data = with_node_b(loss=0.2)
    before = copy.deepcopy(data)
    Topology.from_data(data)
    assert data == before
