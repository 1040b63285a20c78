"""The end-of-job report: its data from a log directory, the simulator's, and the page in a real browser."""

import json
import os
import re
import shutil
import subprocess

import pytest

from p2plearn.monitor import report, write_report
from p2plearn.sim.__main__ import main as sim_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMIUM = shutil.which("chromium")


def write_lines(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def fake_job(directory, ranks: int = 3, rounds: int = 50):
    """A log directory as a job leaves it: rank files, a coordinator's plans and events."""
    for rank in range(ranks):
        write_lines(directory / f"rank-{rank}.jsonl", [
            {"rank": rank, "round": r, "time": 1000.0 + r, "loss": 2.0 / (r + 1) + rank, "compute_s": 0.5,
             "comm_s": 0.3, "send_s": 0.1, "bytes_sent": 100, "deadline_hits": r % 2, "slow_closes": 0}
            for r in range(rounds)])
    plans = [{"kind": "plan", "time": 1000.0 + t, "view_version": t, "min_clock": t, "max_clock": t,
              "members": {str(r): {} for r in range(ranks)},
              "edges": [[r, (r + 1) % ranks, 1e6, 2e6] for r in range(ranks)] if t else []} for t in range(20)]
    events = [{"kind": "event", "time": 999.0, "text": "rank 0 joined"}]
    write_lines(directory / "coordinator-0.jsonl",
                [{"kind": "job", "time": 999.0, "clock": "wall", "job_id": "abc", "settings": {"world_size": ranks}}]
                + events + plans)


def test_report_data_of_a_log_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "MAX_POINTS", 20)
    fake_job(tmp_path)
    data = report.report_data(str(tmp_path))
    assert data["title"] == "p2plearn job abc" and data["ranks"] == 3 and data["rounds"] == 50
    assert data["duration_s"] == pytest.approx(50.0)  # from the first line (999) to the last round (1049)
    # 50 points thinned to every 3rd and the last
    assert [p[0] for p in data["curves"]["1"]] == list(range(0, 50, 3)) + [49]
    assert data["curves"]["1"][0][1] == pytest.approx(3.0)
    split = data["split"][2]
    assert split["rank"] == 2 and split["rounds"] == 50
    assert split["compute_s"] == pytest.approx(25.0) and split["send_s"] == pytest.approx(5.0)
    assert split["wait_s"] == pytest.approx(10.0) and split["deadline_hits"] == 25
    assert len(data["flows"]) == 20 and data["flows"][0][1] == 0 and data["flows"][5] == [6.0, 3, 1e6]
    # the plans drawn: 6 evenly spread over the 19 with flows, the first and the last among them
    assert [p["view_version"] for p in data["plans"]] == [1, 5, 8, 12, 15, 19]
    assert data["plans"][0]["edges"] == [[0, 1, 1e6], [1, 2, 1e6], [2, 0, 1e6]] and data["plans"][0]["members"] == [0, 1, 2]
    assert data["events"] == [[0.0, "rank 0 joined"]]


def test_an_empty_log_directory_is_refused_in_one_line(tmp_path):
    (tmp_path / "rank-0.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match="no rank's rounds"):
        write_report(str(tmp_path), str(tmp_path / "job.html"))


def test_the_simulator_writes_the_same_log_and_report(tmp_path):
    logs, page = tmp_path / "logs", tmp_path / "sim.html"
    assert sim_main(["train", "--topology", os.path.join(ROOT, "topology/heterogeneous-4.json"), "--model", "mlp",
                     "--hidden", "16", "--samples", "1000", "--steps", "40", "--period", "4", "--step-ms", "5",
                     "--eval-ms", "0", "--log-dir", str(logs), "--report", str(page)]) == 0
    data = report.report_data(str(logs))
    assert data["clock"] == "virtual" and data["ranks"] == 4 and data["rounds"] == 10
    assert data["title"].startswith("p2plearn-sim: 4 virtual peers")
    for split in data["split"]:
        # 4 steps of 5 ms of compute per round, virtual
        assert split["rounds"] == 10 and split["compute_s"] == pytest.approx(0.2) and split["send_s"] > 0
    assert len(data["plans"]) == 6 and all(p["edges"] for p in data["plans"])
    assert all(len(points) == 10 for points in data["curves"].values())
    assert page.read_text().count('id="data"') == 1


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium)")
def test_the_report_renders_in_a_browser(tmp_path):
    fake_job(tmp_path)
    page = tmp_path / "job.html"
    write_report(str(tmp_path), str(page))
    assert "http" not in re.sub(r"http://www\.w3\.org/2000/svg", "", page.read_text())  # nothing fetched
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=2000",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=60)
    dom = out.stdout
    curves = {int(r): int(n) for r, n in re.findall(r'class="curve" data-rank="(\d+)" data-points="(\d+)"', dom)}
    assert curves == {0: 50, 1: 50, 2: 50}
    assert re.findall(r'<tr data-rank="(\d+)">', dom) == ["0", "1", "2"]
    assert len(re.findall(r'class="bar (?:compute|send|wait)"', dom)) == 9
    assert re.findall(r'class="plan" data-edges="(\d+)"', dom) == ["3"] * 6
    assert len(re.findall(r'class="edge" data-src', dom)) == 18
    assert 'data-points="20"' in dom  # the flows over time
