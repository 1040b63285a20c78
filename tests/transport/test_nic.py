"""The interface rate that seeds a peer's bandwidth estimate when no topology is given."""
from __future__ import annotations

import pytest

from p2plearn.transport import nic


def test_loopback_is_paced_as_memory_not_as_a_nic():
    assert nic.link_rate("127.0.0.1") == nic.link_rate("127.0.0.5") == nic.LOOPBACK_RATE
    assert nic.interface_of("127.0.0.1") == "lo"


def test_an_address_of_no_interface_here_has_no_rate():
    assert nic.interface_of("203.0.113.77") is None and nic.link_rate("203.0.113.77") is None  # TEST-NET-3
    assert nic.link_rate("not an address") is None


@pytest.mark.parametrize("speed, rate", [("25000\n", 25e9 / 8), ("100", 100e6 / 8), ("-1", None), (None, None),
                                         ("garbage", None)])
def test_the_negotiated_speed_in_sysfs(tmp_path, monkeypatch, speed, rate):
    (tmp_path / "eth9").mkdir()
    if speed is not None:
        (tmp_path / "eth9" / "speed").write_text(speed)
    monkeypatch.setattr(nic, "interface_of", lambda address: "eth9")
    assert nic.link_rate("198.51.100.7", sys_class_net=str(tmp_path)) == rate
