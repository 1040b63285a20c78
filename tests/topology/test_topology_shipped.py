"""The documented topology paths and names work from any directory; a wrong name gets the nearest."""

import json

import pytest

from p2plearn.topology import SHIPPED_DIR, TopologyError, load, resolve, shipped_names


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working directory that is not the repository's root."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_documented_paths_and_bare_names_load_from_any_directory(elsewhere):
    for spelling in ("topology/heterogeneous-4.json", "heterogeneous-4", "heterogeneous-4.json"):
        assert resolve(spelling) == SHIPPED_DIR / "heterogeneous-4.json"
        assert load(spelling).name == load(SHIPPED_DIR / "heterogeneous-4.json").name
    assert "heterogeneous-4" in shipped_names()


def test_a_file_here_comes_before_a_shipped_one(elsewhere):
    mine = {"graph": {"name": "mine"}, "nodes": [{"id": "a", "uplink_mbit": 1, "downlink_mbit": 1}], "edges": []}
    (elsewhere / "topology").mkdir()
    (elsewhere / "topology" / "heterogeneous-4.json").write_text(json.dumps(mine))
    assert load("topology/heterogeneous-4.json").name == "mine"
    assert load("heterogeneous-4").name != "mine"  # a bare name is not a file here: the shipped one


def test_a_name_that_matches_nothing_names_the_nearest_in_one_line(elsewhere):
    with pytest.raises(TopologyError) as caught:
        load("heterogenous-4")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("heterogenous-4: cannot read")
    assert "nearest shipped topologies: heterogeneous-4" in message


def test_other_relative_paths_are_not_looked_up(elsewhere):
    with pytest.raises(TopologyError, match="cannot read"):
        load("somewhere/heterogeneous-4.json")  # only a bare name or a topology/ path means a shipped one
