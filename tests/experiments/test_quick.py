"""Smoke test of the experiment harness: the cheapest script in --quick mode (~70 s) writes a
non-trivial CSV, Markdown table and PNG plot."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)  # three 4-peer trainings: minutes on a busy 2-core machine
def test_layerwise_bounds_quick(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "layerwise_bounds.py"), "--quick",
                           "--out", str(tmp_path)], cwd=ROOT / "experiments", capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(tmp_path / "layerwise_bounds.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and all(r["ok"] == "True" for r in rows), rows
    assert all(0.0 <= float(r["averaged_accuracy"]) <= 1.0 for r in rows)
    md = (tmp_path / "layerwise_bounds.md").read_text()
    assert "Emulated" in md and md.count("\n| ") >= 4 and "layerwise_bounds.png" in md
    png = (tmp_path / "layerwise_bounds.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
