"""Shared machinery of the experiment scripts: run jobs, repeat over seeds, summarise, write results.

Every script calls `parse_args`, runs its configurations with `repeat` (each run through `train`,
which starts `p2plearn.launch` around the MNIST-1D example and reads rank 0's JSON), and hands its
rows to `write_results`, which writes `<out>/<name>.csv` (raw rows), `<name>.md` (setup + table)
and `<name>.png` (the figure the script draws). The .md starts with the run's `Measured:` line
(commit, tree, load, seeds, command: experiments/provenance.py), which the .png carries too.
Medians are over seeds, a target never reached counting as the slowest run ('never'); a script
with --report rewrites its .md and .png from the stored CSV when that summary changes.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import provenance  # noqa: E402  (experiments/ is the script's directory: on sys.path)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
PY = sys.executable
MLP_HIDDEN = 512  # the MNIST-1D MLP of the per-step experiments: 0.29M parameters, 1.2 MB a round at --period 1
Row = dict[str, Any]
READING = "Reading (ours):"  # how the paragraph we add to a results file by hand begins


def results_name(name: str) -> str:
    """A `--name` flag's type: a results name that experiments/registry.py has an entry for (the
    results' Measured: line is read from it), refused when parsed rather than after the runs."""
    from registry import entry
    try:
        entry(name)
    except KeyError as e:
        raise argparse.ArgumentTypeError(f"{e.args[0]}: add one (the command and the code it measures) "
                                         "before the run") from None
    return name


def parse_args(doc: str, argv: list[str] | None = None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None,
               full_seeds: int | None = 3, report: bool = False) -> argparse.Namespace:
    """--quick, --out, --seeds: the flags every experiment takes (``extra`` adds an experiment's own).
    --seeds defaults to 1 with --quick, else to ``full_seeds`` (None: left to the script, per part).
    ``report``: the script can also rewrite its tables from the rows it stored (--report: `read_rows`
    of the stored CSV, then `write_results(..., report=True)`)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    if extra:
        extra(ap)
    ap.add_argument("--quick", action="store_true", help="smallest setup (a minute or two): a smoke test")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for <name>.csv/.md/.png")
    ap.add_argument("--seeds", type=int, default=None, help="repetitions per configuration (default 1 quick, "
                    f"{full_seeds or 'per part'} full)")
    if report:
        ap.add_argument("--report", action="store_true",
                        help="no runs: rewrite <out>/<name>.md and .png from the <name>.csv stored there, keeping "
                        "its Measured: line and our reading (after a change to how the rows are summarised)")
    args = ap.parse_args(argv)
    args.report = getattr(args, "report", False)
    args.seeds = args.seeds or (1 if args.quick else full_seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def is_root() -> bool:
    return os.geteuid() == 0


def train(np_: int, options: dict[str, Any], script: dict[str, Any], *, topology: str | os.PathLike | None = None,
          testbed: bool = False, timeout: float = 900, example: str = "mnist1d") -> Row | None:
    """Run `p2plearn.launch -np N [options] -- python -m p2plearn.examples.<example> [script]`; rank 0's
    JSON, or None (with the tail of the output on stderr) when the job failed."""
    flags: list[str] = []  # the failure detector's defaults: a start-up grace covers slow imports
    # The claims measured before the defaults became --period 16 --fanout 1 --compress int4 compare
    # uncompressed per-step rounds with p=2: they keep that unless they say otherwise.
    options = {"period": 1, "fanout": 2, "compress": "none", **options}
    if topology:
        flags += ["--topology", str(topology), "--testbed" if testbed else "--emulate"]
    for key, value in options.items():  # True: a flag alone (--overlap); False: left out
        if value is not False:
            flags += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    with tempfile.TemporaryDirectory(prefix="p2pexp-") as tmp:
        out = Path(tmp) / "result.json"
        argv = [PY, "-m", "p2plearn.launch", "-np", str(np_), *flags, "--", PY, "-m", f"p2plearn.examples.{example}",
                *args_of(script), "--json", str(out)]
        return run_json(argv, out, timeout)


def torch_job(script_path: Path, n: int, script: dict[str, Any], *, testbed: bool, port: int,
              topology: str) -> Row | None:
    """A torch baseline script (experiments/torch_*.py) on n ranks under torch.distributed's env://
    (gloo on loopback, or in the testbed's namespaces of topology/<topology>.json when `testbed`; the
    namespaces are removed also on failure); n == 1 runs one process with no network. Rank 0's JSON."""
    with tempfile.TemporaryDirectory(prefix="p2pexp-") as tmp:
        out = Path(tmp) / "torch.json"
        argv = [PY, str(script_path), *args_of(script), "--json", str(out)]
        env = {"WORLD_SIZE": str(n), "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        if n == 1:
            return run_json(argv, out, timeout=900)
        if not testbed:
            procs = [subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env, "RANK": str(i),
                                                            "MASTER_ADDR": "127.0.0.1"}) for i in range(n)]
            codes = [p.wait(timeout=1800) for p in procs]
            return json.loads(out.read_text()) if not any(codes) and out.exists() else None
        from p2plearn.testbed import Testbed

        with Testbed(ROOT / "topology" / f"{topology}.json", name="exptorch") as tb:
            procs = [tb.run(i, argv, env={**env, "RANK": str(i), "MASTER_ADDR": tb.address(0),
                                          "GLOO_SOCKET_IFNAME": tb.interface(i)}, cwd=ROOT) for i in range(n)]
            codes = [p.wait(timeout=1800) for p in procs]
        return json.loads(out.read_text()) if not any(codes) and out.exists() else None


def args_of(script: dict[str, Any]) -> list[str]:
    """{"epochs": 2} -> ["--epochs", "2"]."""
    return [x for k, v in script.items() for x in (f"--{k.replace('_', '-')}", str(v))]


def run_json(argv: list[str], out: Path, timeout: float) -> Row | None:
    """Run argv (cwd = repository root, OMP_NUM_THREADS=1) and read the JSON it writes to `out`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  timed out after {timeout:g} s: {' '.join(argv[:8])} ...", file=sys.stderr)
        return None
    if proc.returncode or not out.exists():
        print(f"  failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-1500:]}", file=sys.stderr)
        return None
    return json.loads(out.read_text())


def repeat(config: Row, seeds: int, run: Callable[[int], Row | None], first_seed: int = 0) -> list[Row]:
    """`run(seed)` for `seeds` seeds from `first_seed`; each result merged into a copy of `config` (a
    failed run becomes a row with ok=False, so that it shows in the table instead of vanishing)."""
    rows = []
    for seed in range(first_seed, first_seed + seeds):
        label = ", ".join(f"{k}={v}" for k, v in config.items())
        print(f"  {label}, seed {seed} ...", file=sys.stderr, flush=True)
        result = run(seed)
        rows.append({**config, "seed": seed, "ok": result is not None, **(result or {}),
                     "finished_utc": time.strftime("%H:%M:%S", time.gmtime()), "load_1min": os.getloadavg()[0]})
    return rows


def repeat_all(configs: Iterable[Row], seeds: int, run: Callable[[Path, Row, int], Row | None]) -> list[Row]:
    """`repeat` of `run(tmp, config, seed)` for each config, in one temporary directory they share
    (topology files, a run's JSON); says how many runs took how long."""
    rows: list[Row] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="p2psim-") as tmp:
        for config in configs:
            rows += repeat(config, seeds, lambda seed, config=config: run(Path(tmp), config, seed))
    print(f"{len(rows)} runs in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return rows


def seed_count(rows: list[Row]) -> int:
    """How many seeds the rows ran (each configuration the same)."""
    return len({r["seed"] for r in rows})


def load_note(rows: list[Row]) -> str:
    """A sentence on when the rows ran and how loaded the (shared) machine was, for a setup text."""
    loads = [r["load_1min"] for r in rows if "load_1min" in r]
    if not loads:
        return ""
    return (f"Ran until {rows[-1]['finished_utc']} UTC; load average (1 min) after each run: median "
            f"{statistics.median(loads):.1f}, max {max(loads):.1f} on {os.cpu_count()} cores (this run's own "
            f"processes count in it; so does other people's work on the shared machine: timings are slower and "
            f"noisier when it is high).")


def time_to_accuracy(history: Iterable[tuple[float, float]], target: float) -> float:
    """Wall seconds of the first evaluation at or above `target`; inf if never reached (a miss: slower
    than any time, so that a median over seeds counts it; a failed run is nan and counts nowhere)."""
    return next((t for t, acc in history if acc >= target), math.inf)


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summary(values: Iterable[float]) -> tuple[float, float, float]:
    """(median, min, max) over the values that are not nan (a failed run): inf (a target never
    reached) counts as the slowest; nans when every value is nan."""
    known = [v for v in values if v is not None and not math.isnan(v)]
    if not known:
        return math.nan, math.nan, math.nan
    return statistics.median(known), min(known), max(known)


def number(value: float, fmt: str = ".3g") -> str:
    """`value` in `fmt`; inf (a target never reached) as 'never'."""
    return "never" if value == math.inf else f"{value:{fmt}}"


def cell(values: Iterable[float], fmt: str = ".3g") -> str:
    """'median [min-max]' for a table, a target never reached as 'never' (counted in the median); '-'
    when every run failed, '(k n/a)' after the figures for the k failed runs among the others."""
    values = list(values)
    med, lo, hi = summary(values)
    if math.isnan(med):
        return "-"
    failed = sum(1 for v in values if v is None or math.isnan(v))
    spread = "" if lo == hi else f" [{number(lo, fmt)}-{number(hi, fmt)}]"
    return f"{number(med, fmt)}{spread}" + (f" ({failed} n/a)" if failed else "")


def groups(rows: list[Row], keys: list[str]) -> dict[tuple, list[Row]]:
    """Rows grouped by the values of `keys`, in first-seen order."""
    out: dict[tuple, list[Row]] = {}
    for row in rows:
        out.setdefault(tuple(row.get(k) for k in keys), []).append(row)
    return out


def table(rows: list[Row], keys: list[str], metrics: dict[str, Callable[[Row], float]],
          baseline: tuple | None = None, ratio_of: str | None = None, fmt: str = ".3g") -> str:
    """A Markdown table: one line per configuration (`keys`), each metric as median [min-max] over
    the seeds in `fmt`; with `baseline` (a key tuple) and `ratio_of` (a metric), a column of the ratio
    of the medians, configuration / baseline."""
    grouped = groups(rows, keys)
    header = [*keys, *metrics] + ([f"{ratio_of} / baseline"] if ratio_of else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    base = summary(metrics[ratio_of](r) for r in grouped.get(baseline, []))[0] if ratio_of else math.nan
    for key, rs in grouped.items():
        cells = [str(k) for k in key] + [cell((f(r) for r in rs), fmt) for f in metrics.values()]
        if ratio_of:
            med = summary(metrics[ratio_of](r) for r in rs)[0]
            cells.append(number(med / base, ".2f") if base and math.isfinite(base) and not math.isnan(med) else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def metric(name: str) -> Callable[[Row], float]:
    """A metric reading `name` from a row (nan for a failed run)."""
    return lambda r: float(r[name]) if r.get("ok", True) and r.get(name) is not None else math.nan


def add_streaming_metrics(r: Row) -> None:
    """A p2plearn run's peak uplink (MB/s, its engine's counter per 1 s window: rounds run in the
    background) and wall / max(compute, its rounds' summed duration), when its JSON has them."""
    if "peak_uplink_bytes_per_s" in r:
        r["peak_uplink_mb_s"] = r["peak_uplink_bytes_per_s"] / 1e6
        r["wall_over_bound"] = r["wall_s"] / max(sum(r["round_times"]), r["compute_s"])


# The columns add_streaming_metrics fills.
STREAMING_METRICS = {"peak uplink MB/s": metric("peak_uplink_mb_s"), "wall / bound": metric("wall_over_bound")}


def compute_clock(sim_result: dict[str, Any]) -> Row:
    """The compute clock of a `p2plearn-sim train` run (its --json): milliseconds per local step and
    per evaluation, calibrated on this host (cached) or given. A row carrying them has
    `write_results` name them: a virtual run's seconds follow from them and the network."""
    return {"step_ms": sim_result["costs"]["step_s"] * 1e3, "eval_ms": sim_result["costs"]["eval_s"] * 1e3}


def clock_sentence(rows: list[Row]) -> str:
    """The sentence naming each distinct compute clock of `rows` (see compute_clock), or ""."""
    clocks = sorted({(r["step_ms"], r["eval_ms"]) for r in rows if "step_ms" in r and "eval_ms" in r})
    if not clocks:
        return ""
    return (" Compute clock (the simulator's calibration on this host, or given): " +
            "; ".join(f"a step {step:.3g} ms, an evaluation {ev:.3g} ms" for step, ev in clocks) + ".")


def read_rows(path: Path) -> list[Row]:
    """The rows of a CSV that `write_results` wrote (JSON lists and numbers back, True/False back to
    booleans, an empty field, a failed run's missing value, to None)."""
    def value(text: str) -> Any:
        if text in ("", "True", "False"):
            return None if text == "" else text == "True"
        try:
            return json.loads(text)
        except ValueError:
            try:
                return float(text)  # nan and inf, which JSON spells otherwise
            except ValueError:
                return text

    if not path.exists():
        raise SystemExit(f"{path} does not exist (run the experiment first)")
    with open(path, newline="") as f:
        return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(f)]


def write_results(out: Path, name: str, rows: list[Row], title: str, setup: str, tables: str,
                  draw: Callable[[plt.Axes], None], notes: str = "", report: bool = False) -> None:
    """Write <out>/<name>.csv (every row, list-valued fields as JSON), <name>.md and <name>.png; the
    .md's first line after the title, and the .png's Description, say what the rows measured.
    ``report``: the rows are the stored CSV's (--report): the CSV, the .md's Measured: line and
    the paragraph of our reading at its end (from READING on) stay as they were."""
    path = out / f"{name}.md"
    if report:
        stored = path.read_text() if path.exists() else ""
        kept = provenance.parse(stored)
        if kept is None:
            raise SystemExit(f"--report: {path} has no Measured: line to keep")
        measured = kept.line()
        reading = stored[stored.index(READING):] if READING in stored else ""
    else:
        fields = list(dict.fromkeys(k for r in rows for k in r))
        with open(out / f"{name}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            for r in rows:
                writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()})
        measured = provenance.current(name, rows).line()
        reading = ""
    md = (f"# {title}\n\n{measured}\n\n{setup.strip()}{clock_sentence(rows)}\n\n{tables.strip()}\n\n"
          f"![{name}]({name}.png)\n")
    path.write_text(md + (f"\n{notes.strip()}\n" if notes else "") + (f"\n{reading.strip()}\n" if reading else ""))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    draw(ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110, metadata={"Description": measured})
    plt.close(fig)
    print(f"wrote {out / name}.csv/.md/.png", file=sys.stderr)
    print(md)


def bar_chart(ax: plt.Axes, rows: list[Row], keys: list[str], value: Callable[[Row], float], ylabel: str,
              title: str) -> None:
    """Bars of the median over seeds per configuration, with min-max error bars; a configuration
    whose runs never reached the target (inf) says how many in its label, its bar and bar ends
    drawn only where finite."""
    labels, meds, lows, highs = [], [], [], []
    for key, rs in groups(rows, keys).items():
        values = [value(r) for r in rs]
        med, lo, hi = summary(values)
        never = sum(1 for v in values if v == math.inf)
        labels.append("\n".join(str(k) for k in key) + (f"\n({never} never)" if never else ""))
        shown = math.isfinite(med)
        meds.append(med if shown else 0.0)
        lows.append(med - lo if shown else 0.0)
        highs.append(hi - med if shown and math.isfinite(hi) else 0.0)
    ax.bar(range(len(labels)), meds, yerr=[lows, highs], capsize=3, color="tab:blue")
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)


def accuracy_curves(ax: plt.Axes, rows: list[Row], keys: list[str], title: str) -> None:
    """Test accuracy against wall seconds, seed 0 of each configuration (one line each)."""
    for key, rs in groups(rows, keys).items():
        hist = next((r["history"] for r in rs if r.get("ok") and r.get("history")), None)
        if hist:
            ax.plot([h[0] for h in hist], [h[1] for h in hist], marker="o", label=" ".join(str(k) for k in key))
    ax.set_xlabel("wall time since training start (s)")
    ax.set_ylabel("test accuracy (rank 0)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
