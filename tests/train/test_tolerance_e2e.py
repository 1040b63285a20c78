"""End to end (emulated, 4 peers, MNIST-1D, 10% injected loss): adaptive and layerwise tolerance
keep exact delivery's accuracy with shorter rounds; the value filter sends far fewer bytes.

Rounds get shorter because tolerated loss is not retransmitted: that is what these tests assert.
The time ratios are printed, not asserted: on a shared 2-core machine separate runs of the same
configuration differ by more (about 15%) than the effect (about 10% at 10% loss); the
benchmarks and experiments measure time."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from p2plearn.topology import homogeneous, save

# 9 epochs: at 6 the accuracy (constant lr) was still climbing and single runs of one setting spread
# 0.957-0.979, so one run against another missed the 0.02 margin now and then (CI: 0.945 against
# 0.965); at 9 they spread 0.971-0.980 (4 runs each of exact and adaptive, at load 2-6).
PEERS, EPOCHS, WIDTH = 4, 9, 96
# pytest-timeout charges a module fixture's training run to the first test that uses it: on a busy
# 2-core machine that run and the test's own take minutes each.
pytestmark = pytest.mark.timeout(1500)


def train(tmp_path, name: str, *flags: str) -> dict:
    topo = tmp_path / "lossy.json"
    if not topo.exists():
        # 100 Mbit/s links: the network, not the two shared cores, sets the round time
        save(homogeneous(PEERS, mbit=100, loss=0.10), topo)
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "p2plearn.launch", "-np", str(PEERS), "--topology", str(topo), "--emulate",
           "--period", "1", "--fanout", "2", "--compress", "none", *flags,  # the policies act per round: one per
           # step, on float32 messages (the bytes the filter saves, the chunks a bound lets go)
           "--", sys.executable, "-m", "p2plearn.examples.mnist1d", "--epochs", str(EPOCHS),
           "--width", str(WIDTH), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def exact(tmp_path_factory) -> dict:
    return train(tmp_path_factory.mktemp("exact"), "exact", "--tolerance", "fixed", "--loss-bound", "0")


def median(result: dict, key: str) -> float:
    return statistics.median(result[key])


@pytest.mark.slow
# adaptive: --loss-bound is its ceiling; above the 10% measured loss so that the first pass suffices.
# layerwise: --loss-bound is the bytes-weighted target.
@pytest.mark.parametrize("tolerance,bound", [("adaptive", "0.2"), ("layerwise", "0.1")])
def test_tolerant_rounds_are_faster_at_the_same_accuracy(tmp_path, exact, tolerance, bound):
    got = train(tmp_path, tolerance, "--tolerance", tolerance, "--loss-bound", bound)
    # The policy shortens the transfer (no retransmission pass); a round's wall time also holds
    # waiting for peers that are still computing, which no tolerance policy changes.
    send = median(got, "send_times") / median(exact, "send_times")
    whole = median(got, "round_times") / median(exact, "round_times")
    print(f"{tolerance}: accuracy {got['averaged_accuracy']:.3f} vs exact {exact['averaged_accuracy']:.3f}; "
          f"median transfer {send:.2f}x exact's, median round {whole:.2f}x")
    print(f"  retransmitted datagrams: {got['retransmitted']} vs exact {exact['retransmitted']}")
    assert got["averaged_accuracy"] >= exact["averaged_accuracy"] - 0.02
    assert got["retransmitted"] < 0.5 * exact["retransmitted"]


@pytest.mark.slow
def test_value_filter_halves_the_bytes_at_the_same_accuracy(tmp_path, exact):
    got = train(tmp_path, "value", "--filter", "value")
    ratio = exact["bytes_sent"] / got["bytes_sent"]
    print(f"value filter: accuracy {got['averaged_accuracy']:.3f} vs {exact['averaged_accuracy']:.3f}; "
          f"{ratio:.2f}x fewer bytes")
    assert got["averaged_accuracy"] >= exact["averaged_accuracy"] - 0.02
    assert ratio >= 2.0
