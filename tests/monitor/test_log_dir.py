"""--log-dir: each rank's rounds as JSON lines and TensorBoard event files, bounded and off the round's path."""

import json
import os
import subprocess
import sys

import pytest

from p2plearn.monitor import round_log
from p2plearn.monitor.round_log import NO_TENSORBOARD, RoundLog, read_rounds
from p2plearn.sync import RoundStats

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "small_trainer.py")


def round_stats(rnd: int, **results: int) -> RoundStats:
    return RoundStats(round=rnd, receivers=[1, 2], senders=[1], merged=1, delivered=0.9, fanout=2.0, planned_s=0.01,
                      comm_s=0.05 + rnd / 100, send_s=0.02, bytes_sent=4096, retransmitted=3, results=results)


def scalars(directory: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in ``directory``, read by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(directory)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_rounds_are_json_lines_and_tensorboard_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    log = RoundLog(str(tmp_path), 3)
    for rnd in range(5):
        log.add(round_stats(rnd, exact=1, deadline=rnd % 2, slow=1), loss=1.0 / (rnd + 1), compute_total=0.5 * (rnd + 1))
    log.close()
    records = read_rounds(str(tmp_path / "rank-3.jsonl"))
    assert [r["round"] for r in records] == [0, 1, 2, 3, 4]
    assert [r["deadline_hits"] for r in records] == [0, 1, 0, 1, 0] and all(r["slow_closes"] == 1 for r in records)
    assert all(r["compute_s"] == pytest.approx(0.5) for r in records)  # per round: the difference of the totals
    assert records[2]["loss"] == pytest.approx(1 / 3) and records[2]["comm_s"] == pytest.approx(0.07)
    assert records[0]["results"] == {"exact": 1, "deadline": 0, "slow": 1} and records[0]["receivers"] == [1, 2]
    got = scalars(str(tmp_path / "rank-3"))
    assert [step for step, _ in got["loss"]] == [0, 1, 2, 3, 4]
    assert got["loss"][3][1] == pytest.approx(0.25)
    assert [v for _, v in got["round/deadline_hits"]] == [0, 1, 0, 1, 0]
    assert got["time/comm_s"][4][1] == pytest.approx(0.09) and got["bytes/sent"][0][1] == 4096


def test_without_tensorboard_json_lines_only_and_one_line_said(tmp_path, capsys):
    log = RoundLog(str(tmp_path), 0, tensorboard=False)
    log.add(round_stats(0), loss=None, compute_total=0.1)
    log.close()
    assert capsys.readouterr().err.strip() == NO_TENSORBOARD
    assert sorted(os.listdir(tmp_path)) == ["rank-0.jsonl"]
    assert read_rounds(str(tmp_path / "rank-0.jsonl"))[0]["loss"] is None
    RoundLog(str(tmp_path), 1, tensorboard=False).close()  # the other ranks say nothing
    assert capsys.readouterr().err == ""


def test_a_full_buffer_drops_its_oldest_round_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(round_log, "MAX_PENDING", 4)
    monkeypatch.setattr(round_log, "FLUSH_S", 3600.0)  # the writer waits: the buffer fills
    log = RoundLog(str(tmp_path), 0, tensorboard=False)
    for rnd in range(10):
        log.add(round_stats(rnd), loss=0.5, compute_total=0.0)
    assert log.dropped == 6
    log.close()
    assert [r["round"] for r in read_rounds(str(tmp_path / "rank-0.jsonl"))] == [6, 7, 8, 9]
    assert "6 rounds were not logged" in capsys.readouterr().err


def test_a_line_cut_short_is_skipped(tmp_path):
    path = tmp_path / "rank-0.jsonl"
    path.write_text(json.dumps({"round": 0}) + "\n" + '{"round": 1, "lo' + "\n")
    assert read_rounds(str(path)) == [{"round": 0}]


@pytest.mark.slow
def test_a_job_writes_its_log_dir_and_its_report(tmp_path):
    """p2plearn-run --log-dir --report: 3 peers' rounds (JSON lines, event files), the coordinator's plans, a page."""
    pytest.importorskip("tensorboard")
    logs, page = tmp_path / "logs", tmp_path / "job.html"
    done = subprocess.run([sys.executable, "-m", "p2plearn.launch", "-np", "3", "--log-dir", str(logs), "--report",
                           str(page), "--", sys.executable, TRAINER], cwd=ROOT, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(3):
        records = read_rounds(str(logs / f"rank-{rank}.jsonl"))
        assert [r["round"] for r in records] == list(range(30))
        assert all(r["comm_s"] > 0 and r["loss"] > 0 for r in records)
        assert records[-1]["loss"] < records[0]["loss"]
        got = scalars(str(logs / f"rank-{rank}"))
        assert len(got["loss"]) == 30 and len(got["time/comm_s"]) == 30
        assert os.path.getsize(logs / f"rank-{rank}.log") > 0  # the launcher's copy of its output, as before
    lines = read_rounds(str(logs / "coordinator-0.jsonl"))
    assert lines[0]["kind"] == "job" and lines[0]["settings"]["world_size"] == 3
    assert any(line["kind"] == "plan" and line["edges"] for line in lines)
    assert sum(line["kind"] == "event" and line["text"].endswith("joined") for line in lines) == 3
    assert "p2plearn-run: report of 3 ranks, 30 rounds" in done.stderr and page.stat().st_size > 0


def test_rounds_not_closed_are_written_at_exit(tmp_path):
    """A script that never closes its optimizer still leaves its last rounds (within FLUSH_S) on disk."""
    script = (f"from p2plearn.monitor.round_log import RoundLog\nfrom test_log_dir import round_stats\n"
              f"log = RoundLog({str(tmp_path)!r}, 0, tensorboard=False)\n"
              f"for r in range(3):\n    log.add(round_stats(r), loss=1.0, compute_total=0.0)\n")
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", script], cwd=here, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, here])})
    assert done.returncode == 0, done.stderr
    assert [r["round"] for r in read_rounds(str(tmp_path / "rank-0.jsonl"))] == [0, 1, 2]
