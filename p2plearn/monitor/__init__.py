"""See the job: a live, read-only page of a job and its ``/metrics``, served by its coordinator.

``attach(coordinator, address, secret)`` starts a ``Dashboard`` for a ``control.Coordinator``:
the coordinator feeds a ``JobRecord`` (its snapshot every tick, its broadcasts as made) and the
dashboard's own thread serves the page, its JSON (``/api/state``) and Prometheus' ``/metrics``
from it. The coordinator process starts one when given ``--dashboard [HOST:]PORT`` (or
``P2PLEARN_DASHBOARD``), and so does a successor, so the page exists under every launcher and
comes back after a failover. See docs/monitor.md.
"""

from __future__ import annotations

from typing import Any

from .record import JobRecord
from .server import Dashboard, dashboard_token, parse_address

__all__ = ["Dashboard", "JobRecord", "attach", "dashboard_token", "parse_address"]


def attach(coordinator: Any, address: str, secret: str | bytes, *, advertise: str | None = None) -> Dashboard:
    """Serve ``coordinator``'s job at ``address`` (``[HOST:]PORT``); call before ``coordinator.start()``
    (else the page misses the broadcasts made meanwhile). ``Dashboard.stop()`` ends it."""
    settings = {"job_id": coordinator.job_id, "term": coordinator.term, "world_size": coordinator.world_size,
                "coordinator": coordinator.address, "heartbeat_s": coordinator.heartbeat,
                "phi_threshold": coordinator.phi_threshold, "startup_grace_s": coordinator.startup_grace}
    record = JobRecord(settings, phi_threshold=coordinator.phi_threshold)
    coordinator.watcher = record
    return Dashboard(record, address, secret, advertise=advertise).start()
