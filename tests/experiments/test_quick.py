"""Smoke tests of the experiment harness: scripts in --quick mode write a non-trivial CSV, Markdown
table and PNG plot. The cheapest MNIST-1D script (~70 s), the transformer experiment (local SGD
and two p2plearn configurations, 60 steps each, 4 ranks), and a lying member on the transformer (8
real peers, 80 steps: the sign flip's messages reach the honest ranks, and the clipped merge bounds them)."""
from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_quick(name: str, out: Path, timeout: float) -> tuple[list[dict[str, str]], str]:
    """Run experiments/`name`.py --quick into `out`; its CSV rows and Markdown table, after checking
    that it exits 0 and that its PNG plot is one."""
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / f"{name}.py"), "--quick", "--out", str(out)],
                          cwd=ROOT / "experiments", capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    png = (out / f"{name}.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    with open(out / f"{name}.csv") as f:
        return list(csv.DictReader(f)), (out / f"{name}.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(900)  # three 4-peer trainings: minutes on a busy 2-core machine
def test_layerwise_bounds_quick(tmp_path: Path) -> None:
    rows, md = run_quick("layerwise_bounds", tmp_path, timeout=600)
    assert len(rows) == 3 and all(r["ok"] == "True" for r in rows), rows
    assert all(0.0 <= float(r["averaged_accuracy"]) <= 1.0 for r in rows)
    assert "Emulated" in md and md.count("\n| ") >= 4 and "layerwise_bounds.png" in md


@pytest.mark.slow
@pytest.mark.timeout(1800)  # three 4-rank trainings: minutes each on a busy 2-core machine
def test_charlm_time_to_loss_quick(tmp_path: Path) -> None:
    rows, md = run_quick("charlm_time_to_loss", tmp_path, timeout=1700)
    assert [r["system"] for r in rows] == ["local SGD", "p2plearn", "p2plearn"] and all(r["ok"] == "True" for r in rows)
    assert all(math.isfinite(float(r["averaged_loss"])) and float(r["averaged_loss"]) < math.log(256) for r in rows)
    assert "homogeneous-4" in md and md.count("\n| ") >= 4 and "charlm_time_to_loss.png" in md


@pytest.mark.slow
@pytest.mark.timeout(1200)  # four 8-peer trainings of 80 steps: 4-5 min on a busy 2-core machine
def test_attacks_transformer_quick(tmp_path: Path) -> None:
    rows, md = run_quick("attacks_transformer", tmp_path, timeout=1100)
    assert [(r["attack"], r["robust"]) for r in rows] == [("none", "none"), ("none", "clip"), ("sign flip", "none"),
                                                         ("sign flip", "clip")] and all(r["ok"] == "True" for r in rows)
    loss = {(r["attack"], r["robust"]): float(r["honest_loss"]) for r in rows}
    # measured: clean 2.80 nats, the plain merge under the sign flip 3.0 (its worst honest rank 3.35), clipped 2.82
    assert loss[("sign flip", "none")] > loss[("none", "none")] + 0.1, loss
    assert loss[("sign flip", "clip")] < loss[("sign flip", "none")] - 0.1, loss
    assert "rank 7 attacks (" in md and "attacks_transformer.png" in md


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name,runs", [("sim_scale", 6), ("sim_tolerance", 3), ("sim_value_filter", 3),
                                       ("sim_slow_close", 4), ("attacks_sim", 5), ("defaults_sim", 6)])
def test_virtual_time_experiments_quick(tmp_path: Path, name: str, runs: int) -> None:
    rows, md = run_quick(name, tmp_path, timeout=800)
    assert len(rows) == runs and all(r["ok"] == "True" for r in rows), rows
    assert all(float(r["virtual_s"]) > 0 and 0.0 <= float(r["final_accuracy"]) <= 1.0 for r in rows)
    assert "Virtual time" in md and md.count("\n| ") >= runs + 1 and "time to target" in md
    assert "Compute clock (" in md and all(float(r["step_ms"]) > 0 for r in rows)  # its seconds follow from it
    if name != "sim_tolerance":  # --report rewrites the same file from the stored rows
        proc = subprocess.run([sys.executable, str(ROOT / "experiments" / f"{name}.py"), "--quick", "--report", "--out",
                               str(tmp_path)], cwd=ROOT / "experiments", capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (tmp_path / f"{name}.md").read_text() == md
