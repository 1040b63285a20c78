"""``/metrics``: the job as the coordinator knows it, in Prometheus' text format (``prometheus-client``).

A collector reads the ``JobRecord`` at each scrape (on the monitor's thread, which alone writes
it), so nothing is counted twice and the coordinator's loop does no metrics work. Each peer's
counters (deadline hits, slow closes, its engine's drops by reason) are its own totals over the
job, carried by its round reports: a restarted peer's start again from 0, which Prometheus'
``rate()`` takes for a counter reset.

A non-loopback dashboard asks for its token on ``/metrics`` too: give it to Prometheus as a
``params: {token: [...]}`` entry of the scrape config.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .record import JobRecord

STATES = ("alive", "suspected", "dead", "left")
PEER_GAUGES = (  # (row field, metric name, help)
    ("clock", "p2plearn_peer_clock", "rounds the peer completed"),
    ("loss", "p2plearn_peer_loss", "the peer's last reported training loss"),
    ("uplink", "p2plearn_peer_uplink_bytes_per_second", "the view's estimate of the peer's available uplink"),
    ("downlink", "p2plearn_peer_downlink_bytes_per_second", "the view's estimate of the peer's available downlink"),
    ("compute_s", "p2plearn_peer_compute_seconds", "local work before the peer's last send"),
    ("comm_s", "p2plearn_peer_round_seconds", "the peer's last round's communication time"),
    ("message_bytes", "p2plearn_peer_message_bytes", "the size of the peer's last message"),
)


class JobCollector:
    """The ``prometheus_client`` collector of one ``JobRecord``."""

    def __init__(self, record: JobRecord) -> None:
        self.record = record

    def collect(self) -> Iterator[Metric]:
        record = self.record
        members = GaugeMetricFamily("p2plearn_members", "ranks of the job by state", labels=["state"])
        counts = record.state_counts()
        for state in STATES:
            members.add_metric([state], counts.get(state, 0))
        yield members
        progress = record.progress
        for name, key, text in (("p2plearn_min_clock", "min_clock", "the slowest live peer's clock (rounds)"),
                                ("p2plearn_max_clock", "max_clock", "the highest clock a peer reported (rounds)")):
            yield GaugeMetricFamily(name, text, value=progress.get(key, 0))
        yield GaugeMetricFamily("p2plearn_term", "the coordinator's incarnation (+1 per failover)",
                                value=record.view.get("term", 0))
        yield GaugeMetricFamily("p2plearn_view_version", "the published view's version (a new one: new plan inputs)",
                                value=record.view.get("version", 0))
        yield CounterMetricFamily("p2plearn_reported_bytes", "bytes the peers sent, estimated from their reports "
                                  "(rounds completed x last message size x receivers)", value=record.reported_bytes)
        events = CounterMetricFamily("p2plearn_events", "events this coordinator saw, by kind", labels=["kind"])
        for kind, n in sorted(record.event_counts.items()):
            events.add_metric([kind], n)
        yield events
        for field, name, text in PEER_GAUGES:
            family = GaugeMetricFamily(name, text, labels=["rank", "host"])
            for row in record.peers.values():
                if row["state"] in ("alive", "suspected") and row[field] is not None:
                    family.add_metric([str(row["rank"]), row["host"]], row[field])
            yield family
        yield from _peer_counters(record)


def _peer_counters(record: JobRecord) -> Iterator[Metric]:
    """Each peer's reported counters (departed peers' too: their last report)."""
    families = {name: CounterMetricFamily(f"p2plearn_peer_{metric}", text, labels=["rank", "host"])
                for name, metric, text in (("deadline", "deadline_hits", "sends the round's deadline cut short"),
                                           ("slow", "slow_closes", "sends closed as too slow (--slow-close)"))}
    drops = CounterMetricFamily("p2plearn_peer_drops", "datagrams or messages the peer's engine dropped, by reason "
                                "(see docs/monitor.md)", labels=["rank", "host", "reason"])
    for rank, counts in sorted(record.counts.items()):
        host = record.peers.get(rank, {}).get("host", "")
        for name, n in sorted(counts.items()):
            if name in families:
                families[name].add_metric([str(rank), host], n)
            elif name.startswith("drop_"):
                drops.add_metric([str(rank), host, name[len("drop_"):]], n)
    yield from families.values()
    yield drops


def metrics_text(record: JobRecord) -> bytes:
    """The exposition of ``record`` (a registry of its own: none of this process's other metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(record))
    return generate_latest(registry)
