"""The dashboard of an in-process coordinator: its page, its JSON, its token and its bounds."""

import json
import secrets

import pytest

from p2plearn.control import Coordinator
from p2plearn.monitor import attach, dashboard_token, parse_address

from monitor_helpers import JOB, RawMembers, get, wait_state


@pytest.fixture
def key():
    return secrets.token_hex(32)


@pytest.fixture
def served(key):
    coordinator = Coordinator(JOB, key, world_size=4, heartbeat=0.1)
    dashboard = attach(coordinator, "127.0.0.1:0", key)
    coordinator.start()
    yield coordinator, dashboard
    coordinator.stop()
    dashboard.stop()


def test_parse_address():
    assert parse_address("8265") == ("127.0.0.1", 8265)
    assert parse_address("0.0.0.0:0") == ("0.0.0.0", 0)
    assert parse_address("[::1]:9000") == ("::1", 9000)
    for bad in ("", "host:", "1:99999", "x:port"):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_the_page_shows_peers_plan_curves_and_events(served, key):
    coordinator, dashboard = served
    members = RawMembers(coordinator.address, key, 4)
    try:
        for clock in range(1, 4):
            for rank in range(4):
                members.report(rank, clock, loss=2.0 / clock + rank)
            # A curve takes a point per coordinator tick (0.1 s here) in which the peer's clock moved.
            wait_state(dashboard, lambda s: s["progress"].get("min_clock") == clock, 5, f"round {clock}")
        s = wait_state(dashboard, lambda s: len(s["curves"]) == 4 and all(len(c) == 3 for c in s["curves"].values()),
                       5, "three points on four curves")
        assert [p["rank"] for p in s["peers"]] == [0, 1, 2, 3]
        assert all(p["state"] == "alive" and p["clock"] == 3 for p in s["peers"])
        assert s["peers"][1]["loss"] == pytest.approx(2.0 / 3 + 1)
        assert s["peers"][0]["compute_s"] == pytest.approx(0.01) and s["peers"][0]["comm_s"] == pytest.approx(0.02)
        assert {(e["src"], e["dst"]) for e in s["edges"]} == {(r, (r + k) % 4) for r in range(4) for k in (1, 2)}
        assert s["curves"]["2"] == [[1, 4.0], [2, 3.0], [3, 2.0 / 3 + 2]]
        assert sum("joined" in text for _, text in s["events"]) == 4
        assert s["settings"]["job_id"] == JOB and s["settings"]["world_size"] == 4

        members.request(3, {"type": "leave", "rank": 3, "session": "s3"})
        live_flows = {(0, 1), (0, 2), (1, 2), (2, 0)}  # the flows to ranks still in the job
        s = wait_state(dashboard, lambda s: {(e["src"], e["dst"]) for e in s["edges"]} == live_flows, 5,
                       "rank 3's flows gone")
        assert s["peers"][3]["state"] == "left" and s["peers"][3]["clock"] == 3
        assert any("rank 3 left" in text for _, text in s["events"])

        status, page = get(f"http://127.0.0.1:{dashboard.port}/")
        assert status == 200 and b'<script src="page.js">' in page and b'"job_id": "monitor-job"' in page
        for path in ("/page.js", "/page.css"):
            status, body = get(f"http://127.0.0.1:{dashboard.port}{path}")
            assert status == 200 and b"http://" not in body.replace(b"http://www.w3.org/2000/svg", b"")  # no CDN
    finally:
        members.close()


def test_a_dead_peer_is_marked_dead(served, key):
    coordinator, dashboard = served
    members = RawMembers(coordinator.address, key, 2)
    try:
        members.report(1, 1, loss=1.0)
        wait_state(dashboard, lambda s: len(s["peers"]) == 2, 5, "two peers")
        members.socks[1].close()  # its connection closes, as a killed process's does
        s = wait_state(dashboard, lambda s: s["peers"][1]["state"] == "dead", 10, "rank 1 dead")
        assert s["peers"][0]["state"] == "alive"
        assert any("rank 1 declared dead" in text for _, text in s["events"])
    finally:
        members.close()


def test_a_wide_bind_asks_for_the_token(key):
    coordinator = Coordinator(JOB, key, world_size=1)
    dashboard = attach(coordinator, "0.0.0.0:0", key, advertise="example-host")
    try:
        token = dashboard_token(key)
        assert dashboard.url == f"http://example-host:{dashboard.port}/?token={token}"
        base = f"http://127.0.0.1:{dashboard.port}"
        for path in ("/", "/api/state", "/metrics", "/page.js"):
            assert get(base + path)[0] == 403
            assert get(base + path + "?token=" + "0" * 32)[0] == 403
        assert get(f"{base}/api/state?token={token}")[0] == 200
        assert dashboard_token(secrets.token_hex(32)) != token
    finally:
        dashboard.stop()
        coordinator.stop()


def test_requests_are_bounded_and_read_only(served):
    _, dashboard = served
    base = f"http://127.0.0.1:{dashboard.port}"
    assert get(base + "/" + "a" * 5000)[0] == 414
    assert get(base + "/?" + "&".join(f"f{i}=1" for i in range(20)))[0] == 400
    assert get(base + "/nothing")[0] == 404
    import urllib.request
    for method in ("POST", "PUT", "DELETE"):
        request = urllib.request.Request(base + "/api/state", data=b"x" * 100, method=method)
        try:
            urllib.request.urlopen(request, timeout=5)
            raise AssertionError(f"{method} was served")
        except urllib.error.HTTPError as exc:
            assert exc.code == 405
    assert json.loads(get(base + "/api/state")[1])["peers"] == []  # still serving
