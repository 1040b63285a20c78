"""p2plearn-run takes a shipped topology by name, or by its documented path, from any directory."""

import pytest

from p2plearn.launch.run import UsageError, parse
from p2plearn.topology import SHIPPED_DIR


@pytest.mark.parametrize("spelling", ["heterogeneous-4", "topology/heterogeneous-4.json"])
def test_a_shipped_topology_by_name_from_anywhere(spelling, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, options, _ = parse(["-np", "4", "--topology", spelling, "--emulate", "--", "python", "train.py"])
    assert options.topology == str(SHIPPED_DIR / "heterogeneous-4.json")


def test_a_wrong_name_gets_one_line_with_the_nearest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as caught:
        parse(["-np", "4", "--topology", "heterogenous-4", "--", "python", "train.py"])
    message = str(caught.value)
    assert message.startswith("--topology heterogenous-4: no such file; nearest shipped topologies: heterogeneous-4")
    assert "\n" not in message
