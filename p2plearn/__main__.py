"""``python -m p2plearn``: what p2plearn's entry points are, one line each (it runs nothing).

p2plearn is a library (p2plearn.init(), DecentralizedOptimizer) that a launcher starts; the commands
below are the ways in. Each takes --help for its own manual.
"""
from __future__ import annotations

import argparse
import sys

# (command, what it is for): the console scripts of pyproject.toml first, then the runnable modules
ENTRY_POINTS = (
    ("p2plearn-run -np N -- python train.py", "start a job: the coordinator and N peers, their output and "
                                              "progress (python -m p2plearn.launch is the same)"),
    ("p2plearn-sim train -np N --topology T", "training in virtual time on a simulated network "
                                              "(python -m p2plearn.sim)"),
    ("p2plearn-testbed up TOPOLOGY", "emulated networks in network namespaces, root only "
                                     "(python -m p2plearn.testbed)"),
    ("python -m p2plearn.examples.mnist1d", "example: a CNN or MLP on MNIST-1D, under p2plearn-run"),
    ("python -m p2plearn.examples.charlm", "example: a byte-level transformer language model, under p2plearn-run"),
    ("python -m p2plearn.examples.transfer_demo", "example: one sender multicasts a model to three processes"),
    ("python -m p2plearn.bench NAME", "benchmarks against baselines in the same run (transport, rounds, ...)"),
    ("python -m p2plearn.topology generate|check", "write the shipped topology files, or validate files"),
    ("python -m p2plearn.control", "the coordinator in a process of its own (p2plearn-run starts it)"),
)


def describe() -> str:
    """The entry points as an aligned list, one per line."""
    width = max(len(command) for command, _ in ENTRY_POINTS)
    return "\n".join(f"  {command:<{width}}  {what}" for command, what in ENTRY_POINTS)


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(prog="python -m p2plearn", description=doc.split("\n\n")[1],
                                     epilog="entry points:\n" + describe(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    print("p2plearn's entry points (each takes --help):\n" + describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
