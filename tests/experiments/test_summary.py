"""How the experiments summarise seeds (experiments/common.py): a target never reached counts as the
slowest run, not as a run that did not happen; --report rewrites a results file from its stored rows."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))

import common as c  # noqa: E402


def test_a_target_never_reached_is_inf_and_a_reached_one_its_first_time():
    history = [(1.0, 0.2), (2.0, 0.5), (3.0, 0.7)]
    assert c.time_to_accuracy(history, 0.5) == 2.0
    assert c.time_to_accuracy(history, 0.8) == math.inf


def test_the_median_counts_a_miss_as_the_slowest_and_leaves_failed_runs_out():
    assert c.summary([3.0, 1.0, math.inf]) == (3.0, 1.0, math.inf)  # over the 2 reached it would be 2.0
    assert c.summary([1.0, math.inf, math.inf])[0] == math.inf
    assert c.summary([1.0, 2.0, math.nan, None]) == (1.5, 1.0, 2.0)
    assert all(math.isnan(x) for x in c.summary([math.nan]))


def test_cells_say_never_for_misses_and_count_failed_runs():
    assert c.cell([1.0, 2.0, math.inf]) == "2 [1-never]"
    assert c.cell([1.0, math.inf, math.inf]) == "never [1-never]"
    assert c.cell([math.inf]) == "never"
    assert c.cell([1.0, 3.0, math.nan]) == "2 [1-3] (1 n/a)"
    assert c.cell([math.nan, None]) == "-"


def test_a_table_ratio_is_never_where_the_median_never_reached():
    rows = [{"k": k, "seed": s, "t": t} for k, ts in (("base", [2.0, 2.0, 2.0]), ("miss", [1.0, math.inf, math.inf]),
                                                      ("half", [1.0, 1.0, math.inf])) for s, t in enumerate(ts)]
    table = c.table(rows, ["k"], {"t": c.metric("t")}, baseline=("base",), ratio_of="t")
    lines = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    assert lines["base"].endswith("| 1.00 |") and lines["miss"].endswith("| never |")
    assert lines["half"].endswith("| 0.50 |")


def test_stored_rows_read_back_as_written(tmp_path: Path):
    rows = [{"seed": 0, "ok": True, "tta_s": math.inf, "loss": math.nan, "history": [[1.0, 0.5]], "name": "a b",
             "load_1min": 1.5},
            {"seed": 1, "ok": False}]
    c.write_results(tmp_path, "attacks_sim", rows, "T", "setup", "| a |\n|---|", lambda ax: None)
    back = c.read_rows(tmp_path / "attacks_sim.csv")
    assert back[0]["ok"] is True and back[0]["tta_s"] == math.inf and math.isnan(back[0]["loss"])
    assert back[0]["history"] == [[1.0, 0.5]] and back[0]["name"] == "a b" and back[0]["seed"] == 0
    assert back[1]["ok"] is False and back[1]["tta_s"] is None


def test_report_keeps_the_measured_line_our_reading_and_the_csv(tmp_path: Path):
    rows = [{"seed": 0, "ok": True, "t": 1.0}]
    c.write_results(tmp_path, "attacks_sim", rows, "T", "setup", "| old |\n|---|", lambda ax: None)
    md = tmp_path / "attacks_sim.md"
    measured = next(line for line in md.read_text().splitlines() if line.startswith("Measured: "))
    md.write_text(md.read_text() + f"\n{c.READING} the old table says so.\n")
    csv_before = (tmp_path / "attacks_sim.csv").read_bytes()
    c.write_results(tmp_path, "attacks_sim", c.read_rows(tmp_path / "attacks_sim.csv"), "T", "setup",
                    "| new |\n|---|", lambda ax: None, notes="- verdict", report=True)
    text = md.read_text()
    assert measured in text and "| new |" in text and "| old |" not in text
    assert text.index("- verdict") < text.index(f"{c.READING} the old table says so.")
    assert (tmp_path / "attacks_sim.csv").read_bytes() == csv_before


def test_report_refuses_a_file_without_its_measured_line(tmp_path: Path):
    (tmp_path / "attacks_sim.md").write_text("# T\n\nno line\n")
    with pytest.raises(SystemExit, match="no Measured: line"):
        c.write_results(tmp_path, "attacks_sim", [], "T", "s", "t", lambda ax: None, report=True)
