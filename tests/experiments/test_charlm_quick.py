"""Smoke test of the transformer experiment: charlm_time_to_loss.py --quick (local SGD and two p2plearn
configurations, 60 steps each, 4 ranks) writes its CSV, Markdown table and PNG plot."""
from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # three 4-rank trainings: minutes each on a busy 2-core machine
def test_charlm_time_to_loss_quick(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "charlm_time_to_loss.py"), "--quick",
                           "--out", str(tmp_path)], cwd=ROOT / "experiments", capture_output=True, text=True,
                          timeout=1700)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(tmp_path / "charlm_time_to_loss.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["system"] for r in rows] == ["local SGD", "p2plearn", "p2plearn"] and all(r["ok"] == "True" for r in rows)
    assert all(math.isfinite(float(r["averaged_loss"])) and float(r["averaged_loss"]) < math.log(256) for r in rows)
    md = (tmp_path / "charlm_time_to_loss.md").read_text()
    assert "homogeneous-4" in md and md.count("\n| ") >= 4 and "charlm_time_to_loss.png" in md
    png = (tmp_path / "charlm_time_to_loss.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
