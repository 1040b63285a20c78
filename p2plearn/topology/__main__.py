"""``python -m p2plearn.topology generate [--out DIR]`` | ``check FILE...``"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from p2plearn.topology.generators import STANDARD
from p2plearn.topology.shipped import SHIPPED_DIR
from p2plearn.topology.topology import load, save
from p2plearn.topology.validate import TopologyError



def main(argv: list[str] | None = None) -> int:
    """Generate the standard topology files, or validate files; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m p2plearn.topology",
                                     description="Write the standard topology files, or validate topology files.")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="write the standard topology files")
    generate.add_argument("--out", type=Path, default=SHIPPED_DIR,
                          help="directory to write them to (default: the repository's %(default)s)")
    check = commands.add_parser("check", help="validate topology files")
    check.add_argument("files", nargs="+", type=Path, help="topology files (node-link JSON); exit 2 at the first bad one")
    args = parser.parse_args(argv)

    if args.command == "generate":
        args.out.mkdir(parents=True, exist_ok=True)
        for stem, make in STANDARD.items():
            save(make(), args.out / f"{stem}.json")
            print(args.out / f"{stem}.json")
        return 0
    try:
        for path in args.files:
            topology = load(path)
            print(f"{path}: ok, {len(topology.peers)} peers")
    except TopologyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
