"""Virtual time to a target accuracy against the testbed's stored runs (no testbed needed).

    error = compare(CASES[0], seed=0)   # a Replay: real and virtual seconds to the case's first target

The real runs are the ones already measured and stored in experiments/results/ (same settings, same
seeds), each replayed here in virtual time with the real compute clock: `--step-ms` is the real rank
0's measured computation per step (the CPU share the real peers had) and `--eval-ms 0` (that
measurement, all the time outside rounds, already holds the evaluations), so the comparison does not
depend on how busy this machine is now. The network part, the merge rule and the receive work are
the simulator's. The cases:
- homogeneous-4, heterogeneous-4: time_to_accuracy.csv, "bsp, selmcast p=1, period 16" (testbed;
  MLP 1536, batch 128, 10 epochs, evaluation every 8 steps; target 50%);
- heterogeneous-8: selmcast_vs_random.csv, BSP selmcast p=2, period 1 (`--emulate`; CNN width 64,
  6 epochs, evaluation per epoch; target 60%);
- heterogeneous-16-steady: multicast_16_steady.csv, BSP selmcast p=1 unicast, period 4 (testbed;
  CNN width 64, Dirichlet 0.1, 10 epochs, evaluation every 8 steps; target 50%).
Every real run's peers were processes on this 2-core machine (the testbed's namespaces, or loopback),
so every case is simulated co-located (`--colocate 2`, `sim.hosts`): their rounds' fixed work and
receive work shared the 2 cores (their compute's share is in the measured step time).
`experiments/sim_train_validation.py` writes the table (both clocks, every seed); TOLERANCE is the
goal both ways. Both sides' seconds to a target are read from their curves (the stored run's history),
not from a results column: a re-run's own target (e.g. multicast_16's, fixed by its seed-0 curves) may
not be the case's.
"""
from __future__ import annotations

import csv
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 0.15  # |virtual / real - 1| of the time to target
MLP_FLAGS = ["--sync", "bsp", "--selection", "selmcast", "--fanout", "1", "--period", "16", "--model", "mlp",
             "--hidden", "1536", "--batch-size", "128", "--epochs", "10", "--samples", "12000", "--eval-every", "8",
             "--colocate", "2"]
CASES = [
    {"topology": "homogeneous-4", "source": "time_to_accuracy",
     "pick": {"topology": "homogeneous-4", "settings": "bsp, selmcast p=1, period 16"},
     "flags": MLP_FLAGS, "targets": (0.5, 0.6)},
    {"topology": "heterogeneous-4", "source": "time_to_accuracy",
     "pick": {"topology": "heterogeneous-4", "settings": "bsp, selmcast p=1, period 16"},
     "flags": MLP_FLAGS, "targets": (0.5, 0.6)},
    {"topology": "heterogeneous-8", "source": "selmcast_vs_random", "pick": {"sync": "bsp", "selection": "selmcast",
                                                                            "fanout": "2"},
     "flags": ["--sync", "bsp", "--selection", "selmcast", "--fanout", "2", "--period", "1", "--model", "cnn",
               "--width", "64", "--epochs", "6", "--samples", "12000", "--colocate", "2"],
     "targets": (0.6,)},
    {"topology": "heterogeneous-16-steady", "source": "multicast_16_steady",
     "pick": {"sync": "bsp", "selection": "selmcast", "transport_mode": "unicast"},
     "flags": ["--sync", "bsp", "--selection", "selmcast", "--fanout", "1", "--period", "4", "--model", "cnn",
               "--width", "64", "--epochs", "10", "--samples", "12000", "--dirichlet", "0.1", "--eval-every", "8",
               "--colocate", "2"],
     "targets": (0.5,)},
]


@dataclass
class Replay:
    """One stored real run and its virtual replay: seconds to the target, and the relative error."""

    topology: str
    seed: int
    target: float
    real_s: float
    virtual_s: float

    @property
    def error(self) -> float:
        return self.virtual_s / self.real_s - 1.0


def real_rows(case: dict) -> list[dict]:
    """The stored real runs of `case`, by seed."""
    with open(ROOT / "experiments" / "results" / f"{case['source']}.csv") as f:
        rows = [r for r in csv.DictReader(f) if all(r[k] == v for k, v in case["pick"].items())]
    return sorted(rows, key=lambda r: int(r["seed"]))


def real_step_ms(case: dict, real: dict) -> float:
    """The real rank 0's computation per local step: its compute_s over rounds x period (every step
    of these runs is in a round)."""
    period = int(case["flags"][case["flags"].index("--period") + 1])
    return 1000 * float(real["compute_s"]) / (int(real["rounds"]) * period)


def virtual(case: dict, seed: int, step_ms: float | None) -> dict:
    """The virtual run of `case` (`p2plearn-sim train`'s result); step_ms None: the calibrated clock."""
    from p2plearn.sim.__main__ import main  # the CLI, as a user runs it

    with tempfile.TemporaryDirectory(prefix="p2psim-") as tmp:
        out = Path(tmp) / "run.json"
        argv = ["train", "--topology", str(ROOT / "topology" / f"{case['topology']}.json"),
                "--compress", "none", *case["flags"],  # the testbed rows it is checked against: float32
                "--seed", str(seed), "--json", str(out),
                *(["--step-ms", f"{step_ms:.6g}", "--eval-ms", "0"] if step_ms else [])]
        if main(argv) != 0:
            raise RuntimeError(f"p2plearn-sim {' '.join(argv)} failed")
        return json.loads(out.read_text())


def time_to(history, target: float) -> float:
    """Seconds of the first evaluation at or above `target`; nan if never reached."""
    return next((h[0] for h in history if h[1] >= target), math.nan)


def compare(case: dict, seed: int) -> Replay:
    """The stored real run of `case` with `seed` against its replay on the real compute clock, at the
    case's first target."""
    real = next(r for r in real_rows(case) if int(r["seed"]) == seed)
    target = case["targets"][0]
    sim = virtual(case, seed, real_step_ms(case, real))
    return Replay(case["topology"], seed, target, time_to(json.loads(real["history"]), target),
                  time_to(sim["history"], target))
