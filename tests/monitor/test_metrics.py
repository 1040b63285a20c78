"""``/metrics`` parses with the Prometheus client's own parser and says what the coordinator knows."""

from prometheus_client.parser import text_string_to_metric_families

from monitor_helpers import get, monitored, wait_state


def test_metrics_parse_and_count():
    with monitored(3) as (dashboard, members):
        # Bytes are counted from the rounds a peer completes after the monitor first saw it.
        for clock in (1, 2):
            for rank in range(3):
                members.report(rank, clock, loss=1.0 / clock)
            wait_state(dashboard, lambda s: s["progress"].get("min_clock") == clock, 5, f"round {clock}")
        members.request(2, {"type": "leave", "rank": 2, "session": "s2"})
        wait_state(dashboard, lambda s: s["peers"][2]["state"] == "left" and len(s["edges"]) == 2, 5, "rank 2 left")
        status, body = get(f"http://127.0.0.1:{dashboard.port}/metrics")
        assert status == 200
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
        assert value[("p2plearn_members", (("state", "alive"),))] == 2
        assert value[("p2plearn_members", (("state", "left"),))] == 1
        assert value[("p2plearn_members", (("state", "dead"),))] == 0
        assert value[("p2plearn_min_clock", ())] == 2 and value[("p2plearn_max_clock", ())] == 2
        assert value[("p2plearn_events_total", (("kind", "join"),))] == 3
        assert value[("p2plearn_events_total", (("kind", "leave"),))] == 1
        assert value[("p2plearn_peer_loss", (("host", "sim"), ("rank", "1")))] == 0.5
        assert ("p2plearn_peer_clock", (("host", "sim"), ("rank", "2"))) not in value  # gone
        # Each of 3 peers completed 2 rounds of a 4096-byte message to 2 receivers.
        assert value[("p2plearn_reported_bytes_total", ())] == 2 * 3 * 4096 * 2
        assert families["p2plearn_members"].type == "gauge" and families["p2plearn_events"].type == "counter"


def test_peer_counters_and_the_timeline_come_from_their_reports():
    """Deadline hits, slow closes and drops by reason, as each peer last reported its totals; bad entries left out."""
    with monitored(2) as (dashboard, members):
        members.report(0, 1, 1.0, {"deadline": 1, "slow": 0, "drop_injected": 7})
        members.report(0, 2, 0.9, {"deadline": 3, "slow": 2, "drop_injected": 9, "drop_replayed": 1,
                                   "bad name!": 5, "drop_evicted": -1, "slow_x": "many"})
        members.report(1, 1, 1.0)  # no counters: none shown for it
        s = wait_state(dashboard, lambda s: len(s["timeline"].get("0", [])) == 2 and "1" in s["timeline"], 5,
                       "the reports in the timeline")
        # each round: (when the report came, the round, its compute, its communication)
        assert [r[1:] for r in s["timeline"]["0"]] == [[1, 0.01, 0.02], [2, 0.01, 0.02]]
        assert s["timeline"]["0"][0][0] <= s["timeline"]["0"][1][0]
        status, body = get(f"http://127.0.0.1:{dashboard.port}/metrics")
        assert status == 200
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
        peer0 = (("host", "sim"), ("rank", "0"))
        assert value[("p2plearn_peer_deadline_hits_total", peer0)] == 3
        assert value[("p2plearn_peer_slow_closes_total", peer0)] == 2
        assert value[("p2plearn_peer_drops_total", (*peer0, ("reason", "injected")))] == 9
        assert value[("p2plearn_peer_drops_total", (*peer0, ("reason", "replayed")))] == 1
        assert {labels for name, labels in value if name == "p2plearn_peer_drops_total"} == {
            (*peer0, ("reason", "injected")), (*peer0, ("reason", "replayed"))}
        counters = ("p2plearn_peer_deadline_hits_total", "p2plearn_peer_slow_closes_total", "p2plearn_peer_drops_total")
        assert not any(dict(labels)["rank"] == "1" for name, labels in value if name in counters)
        assert families["p2plearn_peer_drops"].type == "counter"
