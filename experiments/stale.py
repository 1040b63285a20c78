"""Which stored results measured older code: `make experiments-stale`.

    python experiments/stale.py              # each stale results file, its commit and the first change since
    python experiments/stale.py --commands   # the commands that re-measure them (--all: every file)

A file is stale when a commit after the one its `Measured:` line names changed the code it measures
(experiments/registry.py), unless that commit's `Moves-results:` trailer names other results only
(see `provenance.changes_since`), when it was measured on a dirty tree, or when it has no line. `make
experiments` runs every command of the registry (`--all --commands`), in its order.
"""
from __future__ import annotations

import argparse
import sys

import provenance
from registry import RESULTS as REGISTRY
from registry import entry


def results_names() -> list[str]:
    """The stored results, by name (every experiments/results/*.md)."""
    return sorted(p.stem for p in provenance.RESULTS.glob("*.md"))


def why_stale(name: str) -> list[str]:
    """[] when experiments/results/<name>.md measured today's code; else the reasons (the changing
    commits, oldest first)."""
    return provenance.changes_since(provenance.read(name), entry(name).measures, name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commands", action="store_true", help="print the commands that re-measure them")
    ap.add_argument("--all", action="store_true", help="every registered result, stale or not")
    args = ap.parse_args(argv)
    unregistered = [n for n in results_names() if n not in REGISTRY]
    for name in unregistered:
        print(f"{name}.md: no entry in experiments/registry.py", file=sys.stderr)
    names = list(REGISTRY) if args.all else [n for n in REGISTRY if why_stale(n)]
    for name in names:
        if args.commands:
            print(REGISTRY[name].command)
            continue
        reasons = why_stale(name)
        measured = provenance.read(name)
        at = f"measured at {'' if measured.exact else 'or before '}{measured.commit}" if measured else "unmeasured"
        more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
        print(f"{name}.md: {at}; since: {reasons[0] if reasons else 'nothing'}{more}")
    return 1 if unregistered else 0


if __name__ == "__main__":
    sys.exit(main())
