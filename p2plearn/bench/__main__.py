"""python -m p2plearn.bench {transport|selection|rounds|...} [options]; NAME --help for a benchmark's own."""
from __future__ import annotations

import argparse
import importlib
import signal
import sys

BENCHES = {  # name -> (module, what it measures)
    "transport": ("p2plearn.bench.transport", "the engine's goodput against TCP, a raw socket and iperf3"),
    "selection": ("p2plearn.bench.selection", "SELMCAST's planned round time and mixing against random receivers"),
    "rounds": ("p2plearn.bench.rounds", "measured round times of selection policies, or multicast against unicast"),
    "average": ("p2plearn.bench.average", "one full average of a model among n peers against gloo's all_reduce"),
    "ddp": ("p2plearn.bench.ddp", "a DDP training step over the p2plearn backend and its hook against gloo"),
    "sim": ("p2plearn.bench.sim", "seconds the simulator takes for rounds of thousands of peers"),
    "merge": ("p2plearn.bench.merge", "the robust merge's CPU per byte against the plain merge's"),
    "startup": ("p2plearn.bench.startup", "seconds from launch to the first step, and false deaths, on busy cores"),
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in BENCHES:
        # SIGTERM unwinds like Ctrl-C, so that the namespaces and processes a benchmark made are removed.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        importlib.import_module(BENCHES[argv[0]][0]).main(argv[1:])
        return
    parser = argparse.ArgumentParser(
        prog="python -m p2plearn.bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Benchmarks; each prints a Markdown table (--json: the raw rows).",
        epilog="benchmarks:\n" + "\n".join(f"  {name:<10} {about}" for name, (_, about) in BENCHES.items()))
    parser.add_argument("name", choices=BENCHES, metavar="NAME",
                        help="the benchmark (python -m p2plearn.bench NAME --help: its options)")
    parser.parse_args(argv)  # --help exits 0; no name or an unknown one exits 2 with the usage


if __name__ == "__main__":
    main()
