"""The coordinator's plan lines: a change of plan is rate-limited, not lost."""

import json
from types import SimpleNamespace

from p2plearn.control.progress import Progress
from p2plearn.monitor import plan_log
from p2plearn.monitor.plan_log import PlanLog, coordinator_file


def snapshot(members: list[int], flows: list[tuple[int, int]], clock: int) -> dict:
    view = SimpleNamespace(version=1, uplink=[1e9] * 4, downlink=[1e9] * 4)
    return {"members": {r: {"host": "h", "clock": clock, "loss": None} for r in members},
            "links": {src: {dst: {"rate": 1e8, "paced": 2e8, "multicast": False}} for src, dst in flows},
            "view": view, "progress": Progress(clock, clock, len(members), None, None), "term": 0}


def plans(log_dir) -> list[tuple[float, list[int], list]]:
    with open(coordinator_file(str(log_dir), 0)) as f:
        lines = [json.loads(line) for line in f]
    return [(p["time"], sorted(int(r) for r in p["members"]), [e[:2] for e in p["edges"]])
            for p in lines if p["kind"] == "plan"]


def test_a_change_within_plan_min_s_is_held_and_written_later(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(plan_log, "time", SimpleNamespace(time=lambda: clock[0]))  # plan_log's clock only
    log = PlanLog(str(tmp_path), 0)  # not started: this test calls its writer

    def tick(at: float, members: list[int], flows: list[tuple[int, int]], rnd: int = 0) -> None:
        clock[0] = at
        log.observe(snapshot(members, flows, rnd))

    tick(100.0, [0, 1], [])
    log._write()
    tick(100.3, [0, 1], [(0, 1)], 1)  # flows 0.3 s after the last line: held
    log._write()
    assert len(plans(tmp_path)) == 1
    tick(100.6, [0, 1], [(0, 1)], 2)  # the same change again: its latest snapshot is the one held
    clock[0] = 101.1
    log._write()  # PLAN_MIN_S has passed: written, at its own time
    assert plans(tmp_path) == [(100.0, [0, 1], []), (100.6, [0, 1], [[0, 1]])]
    tick(101.3, [0, 1], [(0, 1)], 3)  # the same shape: no line before PLAN_EVERY_S
    log._write()
    tick(101.4, [], [])  # the members leave, then the log stops before PLAN_MIN_S: still written
    log._stop.set()
    log._write()
    assert plans(tmp_path)[2:] == [(101.4, [], [])]
    tick(120.0, [], [])
    log._write()  # the same shape after PLAN_EVERY_S: the clocks moved
    assert plans(tmp_path)[3:] == [(120.0, [], [])]
    log._file.close()
