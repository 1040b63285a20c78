"""Claim: `p2plearn-sim train` predicts a real run's time to a target accuracy within 15%.

    python experiments/sim_train_validation.py [--quick] [--seeds N] [--out DIR]

The real runs are the ones already measured and stored in experiments/results/ (same settings,
same seeds), each replayed here in virtual time: the cases of `p2plearn.sim.validate_train` (co-located,
`--colocate 2`, as the real peers shared this machine's 2 cores).
Two clocks per case: "calibrated" (this machine's single-process step time, as measured now) and
"real compute" (`--step-ms` = the real rank 0's measured computation / its steps: the CPU share
the real peers had, 4-16 processes on 2 cores; `--eval-ms 0`, since that measurement, all the
time outside rounds, already holds the evaluations); the network part is the simulator's in both. The
error is virtual / real - 1 of each seed (its run and its replay), median over seeds. Quick: homogeneous-4 and heterogeneous-4, seed 0.
`--topologies a,b` runs those cases only, into sim_train_validation-a+b.*; `--combine` writes
sim_train_validation.* from every such partial result in the results directory (cases in parallel
processes get more of a shared machine).
"""
from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from pathlib import Path

import common as c

from p2plearn.sim.validate_train import CASES, real_rows, real_step_ms, virtual

NAME = "sim_train_validation"


def extra_flags(ap) -> None:
    ap.add_argument("--topologies", default=None, help="comma-separated cases (default: all)")
    ap.add_argument("--combine", action="store_true", help="merge the partial results in --out")


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv, extra=extra_flags)
    os.chdir(c.ROOT)
    if args.combine:
        return combine(args.out)
    cases = CASES[:2] if args.quick else CASES
    name = NAME
    if args.topologies:
        cases = [case for case in cases if case["topology"] in args.topologies.split(",")]
        name = f"{NAME}-{'+'.join(case['topology'] for case in cases)}"
    seeds = 1 if args.quick else args.seeds
    rows: list[c.Row] = []
    for case in cases:
        for real in real_rows(case)[:seeds]:
            seed = int(real["seed"])
            history = json.loads(real["history"])
            for clock, step_ms in (("calibrated", None), ("real compute", real_step_ms(case, real))):
                print(f"  {case['topology']} seed {seed} {clock} ...", file=sys.stderr, flush=True)
                sim = virtual(case, seed, step_ms)
                row = {"topology": case["topology"], "clock": clock, "seed": seed, "step_ms": 1000 * sim["costs"]["step_s"],
                       "virtual_final": sim["averaged_accuracy"], "real_final": float(real["averaged_accuracy"]),
                       "virtual_history": [h[:2] for h in sim["history"]], "real_history": history,
                       "wall_s": sim["wall_s"], "load_1min": os.getloadavg()[0],
                       "finished_utc": time.strftime("%H:%M:%S", time.gmtime())}
                for target in case["targets"]:
                    row[f"real_{target}"] = c.time_to_accuracy(history, target)
                    row[f"virtual_{target}"] = c.time_to_accuracy(row["virtual_history"], target)
                rows.append(row)
    write(args.out, rows, cases, name)


def combine(out: Path) -> None:
    """sim_train_validation.* from the partial results (`--topologies`) in `out`."""
    rows = []
    for path in sorted(out.glob(f"{NAME}-*.csv")):
        with open(path) as f:
            rows += [{k: json.loads(v) if k.endswith("history") else _number(v) for k, v in r.items()}
                     for r in csv.DictReader(f)]
    done = {r["topology"] for r in rows}
    write(out, rows, [case for case in CASES if case["topology"] in done], NAME)


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def write(out: Path, rows: list[c.Row], cases: list[dict], name: str) -> None:
    lines = ["| topology | clock | target | real s | virtual s | error | step ms | final accuracy real / virtual |",
             "|---|---|---|---|---|---|---|---|"]
    for case in cases:
        for clock in ("calibrated", "real compute"):
            rs = [r for r in rows if r["topology"] == case["topology"] and r["clock"] == clock]
            for target in case["targets"]:
                med, low, high = c.summary(r[f"virtual_{target}"] / r[f"real_{target}"] - 1 for r in rs)
                error = f"{med:+.0%} [{low:+.0%} to {high:+.0%}]" if math.isfinite(med) else "-"
                lines.append(f"| {case['topology']} | {clock} | {target:.0%} | {c.cell(r[f'real_{target}'] for r in rs)} | "
                             f"{c.cell(r[f'virtual_{target}'] for r in rs)} | {error} | "
                             f"{c.cell(r['step_ms'] for r in rs)} | {c.cell(r['real_final'] for r in rs)} / "
                             f"{c.cell(r['virtual_final'] for r in rs)} |")
    setup = ("Virtual time (`p2plearn-sim train`) against the real runs stored in experiments/results/ (same "
             "settings and seeds; see this script's docstring for which). Cells: median [min-max] over seeds; "
             "error: virtual / real - 1 per seed (the replay of the same seed's run, as tests/sim/test_time_to_target "
             "judges it), median [min-max] (goal: median within 15%). calibrated: this machine's step time now; "
             "real compute: the real rank 0's measured computation per step. " + c.load_note(rows))
    first = [r for r in rows if r["topology"] == cases[0]["topology"] and r["seed"] == rows[0]["seed"]]

    def draw(ax) -> None:
        for r in first:
            t, a = zip(*r["virtual_history"])
            ax.plot(t, a, label=f"virtual, {r['clock']}")
        t, a = zip(*first[0]["real_history"])
        ax.plot(t, a, "k--", label="real")
        ax.set_xlabel("seconds")
        ax.set_ylabel("test accuracy, rank 0")
        ax.set_title(f"{cases[0]['topology']}, seed {first[0]['seed']}")
        ax.legend()

    c.write_results(out, name, rows, "Virtual time vs real runs: time to accuracy", setup, "\n".join(lines), draw)


if __name__ == "__main__":
    sys.exit(main())
