"""What a results file measured: the one `Measured:` line at the top of experiments/results/<name>.md.

    Measured: commit 1a2b3c4 (clean) · load (1 min) median 2.1, max 3.0 on 2 cores · seeds 0, 1, 2 · command: `python experiments/x.py`

- commit: the checkout the run measured; `X or earlier` where only an upper bound is known (files
  stored before this line existed: X is the commit that stored them, so nothing after X is in them).
- the tree: `clean` when the code the file measures (experiments/registry.py) had no uncommitted
  change, `dirty` otherwise (such a file is always stale), `tree unknown` for the stored ones.
- load: the 1-minute load average after each run (median, max), or `unknown` / `not recorded`.
- seeds: the seeds of the rows, `unknown` where no row recorded one.
- command: what reproduces the file, from the repository root.

`write_results` (experiments/common.py) writes the line for every experiment; files written by the
library's own tools or from their output (p2plearn.bench, p2plearn.sim.validate/unequal/tracking,
experiments/gpu_charlm.sh, selmcast_16_diagnosis) get theirs with

    python experiments/provenance.py stamp NAME [--seeds 0,1,2]

once the file holds that run's figures (commit and tree as they are now; the load was not recorded:
stamping an unchanged file would date old figures), and
`stamp NAME --from-history` writes the honest bound for a file stored before the line existed.
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import shlex
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
PREFIX = "Measured: "
MOVES = "Moves-results"  # the commit trailer that names the results a change can move (changes_since)
LINE = re.compile(r"^Measured: commit (?P<commit>[0-9a-f]{7,40}|unknown)(?P<bound> or earlier)? "
                  r"\((?P<tree>clean|dirty|tree unknown)\) · load (?P<load>[^·]+?) · seeds (?P<seeds>[^·]+?) · "
                  r"command: `(?P<command>[^`]+)`$", re.MULTILINE)


@dataclass(frozen=True)
class Provenance:
    """One results file's `Measured:` line, parsed (`exact` False: `commit` is an upper bound)."""

    commit: str
    exact: bool
    tree: str
    load: str
    seeds: str
    command: str

    def line(self) -> str:
        bound = "" if self.exact else " or earlier"
        return (f"{PREFIX}commit {self.commit}{bound} ({self.tree}) · load {self.load} · seeds {self.seeds} · "
                f"command: `{self.command}`")


def parse(text: str) -> Provenance | None:
    """The `Measured:` line of a results file's text, or None when it has none."""
    m = LINE.search(text)
    if not m:
        return None
    return Provenance(m["commit"], not m["bound"], m["tree"], m["load"], m["seeds"], m["command"])


def read(name: str) -> Provenance | None:
    """The `Measured:` line of experiments/results/<name>.md (None: no line, or no file)."""
    path = RESULTS / f"{name}.md"
    return parse(path.read_text()) if path.exists() else None


def git(*args: str) -> str:
    """`git args` in the repository root, its stdout stripped ('' when git or the checkout is missing)."""
    try:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def current(name: str, rows: Iterable[dict[str, Any]], argv: list[str] | None = None) -> Provenance:
    """The line for a run of results `name` that just produced `rows`, from this checkout and `argv`
    (default: this process's command line)."""
    from registry import entry  # experiments/ is on sys.path wherever provenance is imported

    rows = list(rows)
    argv = sys.argv if argv is None else argv
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", *entry(name).measures)
    script = Path(argv[0]).resolve()
    shown = str(script.relative_to(ROOT)) if script.is_file() and script.is_relative_to(ROOT) else argv[0]
    command = ("sudo " if os.geteuid() == 0 else "") + shlex.join(["python", shown, *argv[1:]])
    return Provenance(commit, True, "dirty" if dirty else "clean", load_summary(rows, os.cpu_count()), seeds_of(rows),
                      command)


def load_summary(rows: list[dict[str, Any]], cores: int | None) -> str:
    """'(1 min) median M, max X on N cores' over the rows' load_1min (no core count when `cores` is
    None), or 'not recorded'."""
    loads = [float(r["load_1min"]) for r in rows if r.get("load_1min") not in (None, "")]
    if not loads:
        return "not recorded"
    on = f" on {cores} cores" if cores else ""
    return f"(1 min) median {statistics.median(loads):.1f}, max {max(loads):.1f}{on}"


def seeds_of(rows: list[dict[str, Any]]) -> str:
    """The rows' distinct seeds ('0, 1, 2'), or 'unknown' when no row has one."""
    seeds = sorted({int(float(r["seed"])) for r in rows if r.get("seed") not in (None, "")})
    return ", ".join(map(str, seeds)) if seeds else "unknown"


def from_history(name: str) -> Provenance:
    """The honest line for a file stored before this line existed: the commit that last stored its .md
    as the upper bound, the seeds and load from its CSV's rows where they are there, else unknown."""
    from registry import entry

    stored = git("log", "-1", "--format=%h", "--", f"experiments/results/{name}.md")
    if not stored:
        raise SystemExit(f"experiments/results/{name}.md is not in git's history")
    path = RESULTS / f"{name}.csv"
    rows = list(csv.DictReader(path.open())) if path.exists() else []
    load = load_summary(rows, None)  # the machine that ran it is not recorded
    return Provenance(stored, False, "tree unknown", "unknown" if load == "not recorded" else load,
                      seeds_of(rows), entry(name).command)


def stamp(path: Path, provenance: Provenance) -> None:
    """Put `provenance`'s line at the top of the Markdown file `path` (after its title), replacing
    the one there."""
    text = path.read_text()
    if LINE.search(text):
        text = LINE.sub(lambda _: provenance.line(), text, count=1)
    elif text.startswith("# "):
        title, _, rest = text.partition("\n")
        text = f"{title}\n\n{provenance.line()}\n\n{rest.lstrip(chr(10))}"
    else:
        text = f"{provenance.line()}\n\n{text}"
    path.write_text(text)


def changes_since(provenance: Provenance | None, measures: Iterable[str], name: str | None = None) -> list[str]:
    """Why a file with this line is stale: the commits ('abc1234 subject', oldest first) that changed
    its measured code after its commit, or one reason when it cannot be judged fresh (no line, a
    dirty tree, an unknown commit); [] when it is fresh.

    A commit whose message ends with the trailer ``Moves-results: NAME ...`` (or ``none``) says which
    results its change can move: it stales result ``name`` only if it lists it (a change to shared
    code that only some runs reach, e.g. one branch that runs under a filter; the message says why
    the others cannot move, and a test shows it). Without ``name``, or without the trailer, every
    commit that changed the measured code counts."""
    if provenance is None:
        return ["no Measured: line"]
    if provenance.tree == "dirty":
        return ["measured on a tree with uncommitted changes to the code it measures"]
    if not git("rev-parse", "--verify", "--quiet", f"{provenance.commit}^{{commit}}"):
        return [f"commit {provenance.commit} is not in this checkout"]
    log = git("log", "--reverse", f"--format=%h %s%x1f%(trailers:key={MOVES},valueonly,separator=%x20)%x1e",
              f"{provenance.commit}..HEAD", "--", *measures)
    changes = []
    for record in filter(str.strip, log.split("\x1e")):
        subject, _, moves = record.strip("\n").partition("\x1f")
        if name is None or not moves.split() or name in moves.split():
            changes.append(subject)
    return changes


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Write the Measured: line of experiments/results/NAME.md")
    ap.add_argument("action", choices=["stamp", "show"])
    ap.add_argument("name", help="the results name (experiments/results/NAME.md)")
    ap.add_argument("--from-history", action="store_true",
                    help="a file stored before the line existed: the commit that stored it as an upper bound")
    ap.add_argument("--seeds", default="unknown", help="the run's seeds, e.g. 0,1,2 (default: unknown)")
    args = ap.parse_args(argv)
    if args.action == "show":
        print(read(args.name) or "no Measured: line")
        return
    if args.from_history:
        provenance = from_history(args.name)
    else:
        from registry import entry

        measured = current(args.name, [], ["python"])  # commit and tree only: the tool ran just before
        provenance = Provenance(measured.commit, True, measured.tree, "not recorded",
                                ", ".join(args.seeds.split(",")), entry(args.name).command)
    stamp(RESULTS / f"{args.name}.md", provenance)
    print(provenance.line())


if __name__ == "__main__":
    main()
