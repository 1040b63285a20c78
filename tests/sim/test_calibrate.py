"""The calibration cache: measured once per key, and a calibration on a busy host says so."""
from __future__ import annotations

from p2plearn.sim import calibrate


def _calibrate(monkeypatch, tmp_path, load: float, cores: int = 2) -> list[int]:
    monkeypatch.setenv("P2PLEARN_CACHE", str(tmp_path))
    monkeypatch.setattr(calibrate.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(calibrate.os, "cpu_count", lambda: cores)
    measured = []
    calibrate._cached("model", lambda: measured.append(1) or {"step_s": 0.001}, recalibrate=False)
    return measured


def test_busy_host_calibration_warns(monkeypatch, tmp_path, capsys):
    assert _calibrate(monkeypatch, tmp_path, load=2.5) == [1]
    err = capsys.readouterr().err
    assert "while the 1-minute load is 2.5 on 2 cores" in err and "--recalibrate" in err


def test_idle_core_calibrates_silently_and_cache_is_reused(monkeypatch, tmp_path, capsys):
    assert _calibrate(monkeypatch, tmp_path, load=0.9) == [1]
    assert capsys.readouterr().err == ""
    # cached: neither measured again nor warned, however busy the host is now
    assert _calibrate(monkeypatch, tmp_path, load=9.0) == []
    assert capsys.readouterr().err == ""
    assert calibrate._read(calibrate.cache_path()) == {"model": {"step_s": 0.001}}
