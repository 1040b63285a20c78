"""The end-of-job report: one self-contained HTML file drawn from a ``--log-dir``.

``write_report(log_dir, "job.html")`` reads each rank's rounds (``rank-N.jsonl``, ``RoundLog``)
and the coordinators' plans and events (``coordinator-T.jsonl``, ``PlanLog``; a virtual run's
from the simulator, ``SimLog``) and writes a page that needs nothing else (its data, script and
style inline; no CDN): the loss curve of every rank, each rank's time split (compute, its own
sends, waiting: for its senders, the deadline, the merge), the number of flows and their measured
rates over time, and the plan itself at up to ``MAX_PLANS`` moments (a graph of the flows each
sender reported), with the events. ``p2plearn-run --report`` and ``p2plearn-sim train --report``
call it at the end; another launcher calls it once its job ended.

What it embeds is bounded whatever the run's length: ``MAX_POINTS`` points per curve (every k-th
round), ``MAX_POINTS`` flow counts, ``MAX_PLANS`` plans, ``MAX_EVENTS`` events.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from .report_page import render
from .round_log import read_rounds

MAX_POINTS = 400  # per rank's loss curve, and of the flows-over-time chart
MAX_PLANS = 6     # plan graphs drawn, evenly spaced over the run
MAX_EVENTS = 200  # the first ones kept
RANK_FILE = re.compile(r"rank-(\d+)\.jsonl$")
COORDINATOR_FILE = re.compile(r"coordinator-(\d+)\.jsonl$")


def write_report(log_dir: str, path: str, *, title: str | None = None) -> str:
    """Write the report of ``log_dir`` to ``path``; returns a one-line summary of what it holds.
    Raises ``FileNotFoundError`` when ``log_dir`` holds no rank's rounds."""
    data = report_data(log_dir, title)
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(data))
    return (f"report of {data['ranks']} ranks, {data['rounds']} rounds, {len(data['plans'])} plans written to "
            f"{path}")


def report_data(log_dir: str, title: str | None = None) -> dict[str, Any]:
    """What the report shows, as one JSON-able object (see the module docstring)."""
    ranks: dict[int, list[dict[str, Any]]] = {}
    lines: list[dict[str, Any]] = []
    for name in sorted(os.listdir(log_dir)):
        if match := RANK_FILE.match(name):
            ranks[int(match[1])] = read_rounds(os.path.join(log_dir, name))
        elif COORDINATOR_FILE.match(name):
            lines += read_rounds(os.path.join(log_dir, name))
    ranks = {r: records for r, records in ranks.items() if records}
    if not ranks:
        raise FileNotFoundError(f"{log_dir}: no rank's rounds (rank-N.jsonl) to report on")
    lines.sort(key=lambda line: _number(line.get("time")))
    jobs = [line for line in lines if line.get("kind") == "job"]
    plans = [line for line in lines if line.get("kind") == "plan" and isinstance(line.get("edges"), list)]
    times = [_number(r.get("time")) for records in ranks.values() for r in records]
    start = min(times + [_number(line.get("time")) for line in lines])
    job = jobs[0] if jobs else {}
    return {"title": title or job.get("title") or f"p2plearn job {job.get('job_id', os.path.basename(log_dir))}",
            "source": os.path.abspath(log_dir), "clock": job.get("clock", "wall"), "settings": job.get("settings", {}),
            "ranks": len(ranks), "rounds": max(int(r.get("round", 0)) for rs in ranks.values() for r in rs) + 1,
            "duration_s": max(times) - start,
            "curves": {str(r): _thin([[rec.get("round"), rec.get("loss")] for rec in records
                                      if _finite(rec.get("loss"))], MAX_POINTS) for r, records in sorted(ranks.items())},
            "split": [_split(r, records) for r, records in sorted(ranks.items())],
            "flows": _thin([[_number(p["time"]) - start, len(p["edges"]), _mean_rate(p["edges"])] for p in plans],
                           MAX_POINTS),
            "plans": [_plan(p, start) for p in _spread([p for p in plans if p["edges"]], MAX_PLANS)],
            "events": [[_number(e.get("time")) - start, str(e.get("text", ""))[:200]]
                       for e in lines if e.get("kind") == "event"][:MAX_EVENTS]}


def _split(rank: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    """A rank's time split and totals over its rounds: waiting is the round's communication time
    beyond its own sends."""
    def total(field: str) -> float:
        return sum(_number(r.get(field)) for r in records)
    comm, send = total("comm_s"), sum(min(_number(r.get("send_s")), _number(r.get("comm_s"))) for r in records)
    return {"rank": rank, "rounds": len(records), "compute_s": total("compute_s"), "send_s": send,
            "wait_s": max(0.0, comm - send), "bytes_sent": total("bytes_sent"),
            "deadline_hits": total("deadline_hits"), "slow_closes": total("slow_closes"),
            "last_loss": next((r["loss"] for r in reversed(records) if _finite(r.get("loss"))), None)}


def _plan(line: dict[str, Any], start: float) -> dict[str, Any]:
    members = line.get("members") if isinstance(line.get("members"), dict) else {}
    return {"time": _number(line.get("time")) - start, "view_version": line.get("view_version"),
            "min_clock": line.get("min_clock"), "max_clock": line.get("max_clock"),
            "members": sorted(int(r) for r in members if str(r).isdigit()),
            "edges": [edge[:3] for edge in line["edges"] if isinstance(edge, list) and len(edge) >= 3]}


def _mean_rate(edges: list[Any]) -> float:
    rates = [_number(e[2]) for e in edges if isinstance(e, list) and len(e) >= 3 and _number(e[2]) > 0]
    return sum(rates) / len(rates) if rates else 0.0


def _thin(points: list[Any], most: int) -> list[Any]:
    """Every k-th point, and the last, so that at most about ``most`` remain."""
    if len(points) <= most:
        return points
    step = math.ceil(len(points) / most)
    return points[::step] + ([points[-1]] if (len(points) - 1) % step else [])


def _spread(items: list[Any], most: int) -> list[Any]:
    """Up to ``most`` items evenly spaced over ``items``, its first and last among them."""
    if len(items) <= most:
        return items
    return [items[round(i * (len(items) - 1) / (most - 1))] for i in range(most)]


def _number(x: Any) -> float:
    return float(x) if _finite(x) else 0.0


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

