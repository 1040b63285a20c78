"""python -m p2plearn.bench {transport|selection|rounds|...} [options]"""
from __future__ import annotations

import signal
import sys

BENCHES = {
    "transport": "p2plearn.bench.transport",
    "rounds": "p2plearn.bench.rounds",
    "average": "p2plearn.bench.average",
    "selection": "p2plearn.bench.selection",
    "sim": "p2plearn.bench.sim",
    "startup": "p2plearn.bench.startup",
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHES:
        raise SystemExit(f"usage: python -m p2plearn.bench {{{'|'.join(BENCHES)}}} [--help]")
    import importlib

    # SIGTERM unwinds like Ctrl-C, so that the namespaces and processes a benchmark made are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    importlib.import_module(BENCHES[sys.argv[1]]).main(sys.argv[2:])


if __name__ == "__main__":
    main()
