"""Virtual time against a real run: 4 peers on loopback (`--emulate`, heterogeneous-4's rates), the
same flags, seed and data, on both launchers; the virtual peers co-located as the real ones are
(`--colocate` this machine's cores: 4 processes share them).

The virtual clock steps at the real rank 0's own computation per step (`--step-ms` from its compute_s,
evaluations included), so the virtual run is charged the computation the real one paid, under whatever
load it met; a calibration taken a minute later, under another burst of CI's load, is not (one made
every virtual step dearer and this check fail at +28%). The clocks are compared at the last evaluation,
where both runs hold the same total computation (at an earlier step a burst of load in the real run's
second half would make the per-step average overcharge the first). What remains is communication, which
load only slows on the real side, so this live comparison checks the direction load cannot fake: the
virtual clock is never more than 15% above the real one (a model that overcharges a link, a round or
the co-located peers' CPU), and both runs reach the target. Within 15% both ways, at the target, is
checked against the testbed's stored runs, which no load moves (`sim.validate_train`,
tests/sim/test_time_to_target.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from p2plearn.sim.__main__ import main

FLAGS = ["--sync", "bsp", "--period", "4", "--fanout", "1", "--model", "mlp", "--hidden", "256",
         "--epochs", "3", "--samples", "4000", "--batch-size", "32", "--eval-every", "8", "--seed", "0"]
TOPOLOGY = "topology/heterogeneous-4.json"
TARGET = 0.3


def time_to(history: list, target: float) -> float:
    return next((h[0] for h in history if h[1] >= target), float("inf"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_virtual_clock_is_not_above_the_real(tmp_path):
    real_out = tmp_path / "real.json"
    cmd = [sys.executable, "-m", "p2plearn.launch", "-np", "4", "--topology", TOPOLOGY, "--emulate", "--",
           sys.executable, "-m", "p2plearn.examples.mnist1d", *FLAGS, "--json", str(real_out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    real = json.loads(real_out.read_text())
    virtual_out = tmp_path / "virtual.json"
    step_ms = 1000 * real["compute_s"] / real["steps"]
    assert main(["train", "--topology", TOPOLOGY, *FLAGS, "--colocate", str(os.cpu_count()),
                 "--step-ms", f"{step_ms:.6g}", "--eval-ms", "0", "--json", str(virtual_out)]) == 0
    virtual = json.loads(virtual_out.read_text())
    assert real["rounds"] == virtual["rounds"] and len(real["history"]) == len(virtual["history"])
    assert time_to(real["history"], TARGET) < float("inf"), "the real run never reached the target"
    assert time_to(virtual["history"], TARGET) < float("inf"), "the virtual run never reached the target"
    real_s, virtual_s = real["history"][-1][0], virtual["history"][-1][0]
    print(f"last evaluation: virtual {virtual_s:.2f} s, real {real_s:.2f} s; time to {TARGET:.0%}: virtual "
          f"{time_to(virtual['history'], TARGET):.2f} s, real {time_to(real['history'], TARGET):.2f} s; "
          f"rounds {real['rounds']}; final {real['averaged_accuracy']:.3f} / {virtual['averaged_accuracy']:.3f}")
    assert virtual_s / real_s - 1 <= 0.15, (f"virtual {virtual_s:.2f} s against real {real_s:.2f} s: "
                                          f"{virtual_s / real_s - 1:+.1%} (load {os.getloadavg()[0]:.1f})")
