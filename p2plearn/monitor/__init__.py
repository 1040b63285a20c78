"""See the job: a live, read-only page of a job and its ``/metrics``, served by its coordinator.

``attach(coordinator, address, secret)`` starts a ``Dashboard`` for a ``control.Coordinator``:
the coordinator feeds a ``JobRecord`` (its snapshot every tick, its broadcasts as made) and the
dashboard's own thread serves the page, its JSON (``/api/state``) and Prometheus' ``/metrics``
from it. The coordinator process starts one when given ``--dashboard [HOST:]PORT`` (or
``P2PLEARN_DASHBOARD``), and so does a successor, so the page exists under every launcher and
comes back after a failover.

``--log-dir DIR`` (``P2PLEARN_LOG_DIR``): each rank writes its rounds there (``RoundLog``: JSON
lines and TensorBoard event files), and the coordinator its plans and events (``log_plans``);
``write_report(DIR, "job.html")`` makes one self-contained HTML page of them, as ``p2plearn-run
--report`` and ``p2plearn-sim train --report`` do. See docs/monitor.md.
"""

from __future__ import annotations

from typing import Any

from .plan_log import PlanLog
from .record import JobRecord
from .report import write_report
from .round_log import RoundLog
from .server import Dashboard, dashboard_token, parse_address
from .sim_log import SimLog
from .watchers import watch

__all__ = ["Dashboard", "JobRecord", "PlanLog", "RoundLog", "SimLog", "attach", "dashboard_token", "log_plans",
           "parse_address", "write_report"]


def attach(coordinator: Any, address: str, secret: str | bytes, *, advertise: str | None = None) -> Dashboard:
    """Serve ``coordinator``'s job at ``address`` (``[HOST:]PORT``); call before ``coordinator.start()``
    (else the page misses the broadcasts made meanwhile). ``Dashboard.stop()`` ends it."""
    record = JobRecord(_settings(coordinator), phi_threshold=coordinator.phi_threshold)
    dashboard = Dashboard(record, address, secret, advertise=advertise)
    watch(coordinator, record)
    return dashboard.start()


def log_plans(coordinator: Any, log_dir: str) -> PlanLog:
    """Write ``coordinator``'s plans and events to ``log_dir`` (``PlanLog``); call before
    ``coordinator.start()``. ``PlanLog.stop()`` writes what is left and closes the file."""
    plan_log = PlanLog(log_dir, coordinator.term, coordinator.job_id, _settings(coordinator))
    watch(coordinator, plan_log)
    return plan_log.start()


def _settings(coordinator: Any) -> dict[str, Any]:
    """The job's settings as the coordinator knows them (the page and the report show them as they are)."""
    return {"job_id": coordinator.job_id, "term": coordinator.term, "world_size": coordinator.world_size,
            "coordinator": coordinator.address, "heartbeat_s": coordinator.heartbeat,
            "phi_threshold": coordinator.phi_threshold, "startup_grace_s": coordinator.startup_grace}
