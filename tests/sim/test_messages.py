"""p2plearn.sim.messages: --compress and --filter value in virtual runs, as in training."""
from __future__ import annotations

import json

import numpy as np
import pytest

from p2plearn.filter import DENSE
from p2plearn.examples.mnist1d import make_model
from p2plearn.options import Options
from p2plearn.sim.__main__ import main, parser
from p2plearn.sim.messages import Messages
from p2plearn.sim.train import Settings, VirtualTraining
from p2plearn.sync.compress import BLOCK, BLOCK4, Compressor, unpack_int4
from p2plearn.topology import load
from p2plearn.train.data import mnist1d

SIZES = [300, 20, 700, 5]  # four layers (tensors), 1,025 elements: not a multiple of a block
P = sum(SIZES)
SMALL = ["--compress", "none", "--model", "mlp", "--hidden", "32", "--samples", "4000", "--steps", "48", "--period", "8",
         "--batch-size", "32", "--eval-every", "16", "--step-ms", "2"]


def population(rows: np.ndarray, message_bytes: float | None = None, **options) -> Messages:
    replica_bytes = 4.0 * rows.shape[1]
    return Messages.of(Options(**{"compress": "none", **options}), SIZES, len(rows), message_bytes or replica_bytes, replica_bytes, rows, 0)


def rows_of(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, P)).astype(np.float32)


def hand_roundtrip(mode: str, x: np.ndarray) -> np.ndarray:
    """What a receiver reads of x's first message in `mode`, decoded by hand from the wire arrays."""
    wire = Compressor(mode, [x.size]).encode([x], [(0, 0, x.size)])
    if mode == "int8":
        return wire[0] * np.repeat(wire[1], BLOCK)[:x.size]
    if mode == "int4":
        return unpack_int4(wire[0], x.size) * np.repeat(wire[1], BLOCK4)[:x.size]
    return wire[0].astype(np.float32)


def test_plain_runs_take_the_plain_path():
    assert Messages.of(Options(compress="none"), SIZES, 2, 4.0 * P, 4.0 * P, rows_of(2), 0) is None


@pytest.mark.parametrize("mode", ["int8", "int4", "fp16"])
def test_a_compressed_message_merges_as_the_compressors_roundtrip(mode):
    rows = rows_of(2)
    messages = population(rows, compress=mode)
    messages.encode(0, rows)
    own = rows[1].copy()
    messages.merge(own, [messages.delivery(0, 0, 1.0, np.random.default_rng(0))])
    np.testing.assert_allclose(own, (rows[1] + hand_roundtrip(mode, rows[0])) / 2, rtol=1e-6, atol=1e-6)


def test_each_peer_keeps_its_own_residual():
    """Error feedback per peer: the second message carries what the first one's rounding took off."""
    rows = rows_of(2)
    messages = population(rows, compress="int4")
    messages.encode(0, rows)
    first = hand_roundtrip("int4", rows[0])
    messages.encode(1, rows)
    own = np.zeros(P, dtype=np.float32)
    messages.merge(own, [messages.delivery(1, 0, 1.0, np.random.default_rng(0))])
    second = 2 * own
    # the two messages together carry twice the value up to one rounding, not two
    assert np.abs(first + second - 2 * rows[0]).max() <= np.abs(first - rows[0]).max() + 1e-6
    assert not np.allclose(second, first)


@pytest.mark.parametrize("mode", ["int8", "int4", "bf16"])
def test_bytes_on_the_network_are_the_encoded_bytes(mode):
    rows = rows_of(3)
    encoded = Compressor(mode, [P]).wire_bytes([P])
    assert population(rows, compress=mode).encode(0, rows).tolist() == [encoded] * 3
    # a replica standing for a 4 MB model: the same ratio of 4 MB
    scaled = population(rows, message_bytes=4e6, compress=mode).encode(0, rows)
    np.testing.assert_allclose(scaled, encoded * 4e6 / (4 * P))


def test_lost_chunks_are_values_and_the_scales_arrive():
    """Of a message that lost 30% of its chunks, the scales (loss bound 0) arrived, and the receiver
    took exactly the elements whose chunks did."""
    rows = rows_of(2)
    messages = population(rows, message_bytes=40 * 4 * P, compress="int8")  # ~40x the chunks
    messages.encode(0, rows)
    d = messages.delivery(0, 0, 0.7, np.random.default_rng(3))
    assert d.fractions[1] == 1.0 and 0.6 < d.fractions[0] < 0.8
    arrived = d.element_mask(0)
    own = rows[1].copy()
    messages.merge(own, [d])
    want = np.where(arrived, (rows[1] + hand_roundtrip("int8", rows[0])) / 2, rows[1])
    np.testing.assert_allclose(own, want, rtol=1e-6, atol=1e-6)
    # nothing arrived: the scales too are lost, and nothing changes
    nothing = messages.delivery(0, 0, 0.0, np.random.default_rng(3))
    assert not nothing.mask.any()
    own = rows[1].copy()
    messages.merge(own, [nothing])
    np.testing.assert_array_equal(own, rows[1])


def updated(rows: np.ndarray, seed: int) -> np.ndarray:
    """rows after a heavy-tailed (Laplace) update, as SGD's are."""
    return (rows + np.random.default_rng(seed).laplace(0.0, 0.01, rows.shape)).astype(np.float32)


def test_the_value_filter_merges_only_what_travelled():
    start = np.repeat(rows_of(1), 2, axis=0)
    messages = population(start, filter="value", filter_init_scale=2.0)
    rows = updated(start, 1)
    change = rows[0] - start[0]
    messages.encode(0, rows)
    threshold = messages.filters[0].threshold(0)
    passed = np.abs(change) >= threshold
    assert 0 < passed.sum() < P / 2  # sparse layers, with and without elements
    own = start[1].copy()
    messages.merge(own, [messages.delivery(0, 0, 1.0, np.random.default_rng(0))])
    np.testing.assert_array_equal(own != start[1], passed)
    np.testing.assert_allclose(own[passed], (start[1][passed] + rows[0][passed]) / 2, rtol=1e-6)


def test_a_higher_threshold_sends_fewer_bytes():
    start = rows_of(4)
    rows = updated(start, 2)
    sizes = [population(start, filter="value", filter_init_scale=scale).encode(0, rows).mean()
             for scale in (1.0, 2.0, 8.0)]
    assert 4 * P > sizes[0] > sizes[1] > sizes[2]


def test_error_feedback_sent_plus_residual_is_the_sum_of_updates():
    """A mirror that takes the values each message carried (as the receive path reads them) stands,
    per element, the filter's residual short of the sender's model: nothing is lost, only delayed.
    (A layer that travels dense carries every element's current value, the filter's zeros replaced
    as in training: its elements are checked only while they travel sparse.)"""
    start = np.repeat(rows_of(1), 2, axis=0)
    messages = population(start, filter="value", filter_init_scale=3.0)
    rows, mirror = start.copy(), start[0].copy()
    went_dense = np.zeros(P, dtype=bool)
    layer_of = np.repeat(np.arange(len(SIZES)), SIZES)
    for rnd in range(6):
        rows = updated(rows, 10 + rnd)
        messages.encode(rnd, rows)
        d = messages.delivery(rnd, 0, 1.0, np.random.default_rng(rnd))
        went_dense |= np.isin(layer_of, np.flatnonzero(d.arrays[0] == DENSE))
        zeros, ones = np.zeros(P, dtype=np.float32), np.ones(P, dtype=np.float32)
        messages.merge(zeros, [d])
        messages.merge(ones, [d])
        travelled = (zeros != 0) | (ones != 1)
        mirror[travelled] = 2 * zeros[travelled]
        messages.merged(rows)
    residual = np.concatenate([r.reshape(-1) for r in messages.filters[0].residuals])
    checked = ~went_dense
    assert checked.sum() > P / 2
    np.testing.assert_allclose((rows[0] - mirror)[checked], residual[checked], atol=1e-5)
    assert np.abs(residual[checked]).max() > 0  # something is still waiting


def test_a_lossy_filtered_message_keeps_its_header_and_indices():
    start = np.repeat(rows_of(1), 2, axis=0)
    messages = population(start, message_bytes=100 * 4 * P, filter="value", filter_init_scale=0.3)
    rows = updated(start, 4)
    messages.encode(0, rows)
    d = messages.delivery(0, 0, 0.8, np.random.default_rng(5))
    arrays, exact = messages._sent[0][0]
    assert all(f == 1.0 for f, ex in zip(d.fractions, exact) if ex)
    assert min(f for f, ex in zip(d.fractions, exact) if not ex) < 1.0


def run_cli(tmp_path, *extra: str, name: str = "out.json", topology: str = "heterogeneous-4") -> dict:
    out = tmp_path / name
    assert main(["train", "--topology", f"topology/{topology}.json", *SMALL, *extra, "--json", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("flag", [["--compress", "int8"], ["--filter", "value", "--filter-init-scale", "3"]])
def test_a_run_with_the_flag_is_deterministic(tmp_path, flag):
    extra = ["--sync", "ssp", "--compute-spread", "0.5", "--loss-bound", "0.1", *flag]
    a = run_cli(tmp_path, *extra, name="a.json", topology="lossy-4")
    b = run_cli(tmp_path, *extra, name="b.json", topology="lossy-4")
    for key in ("history", "round_log", "virtual_s", "own_accuracy", "averaged_accuracy", "bytes_per_message"):
        assert a[key] == b[key], key
    assert a["delivered"] < 1.0 and 0 < a["bytes_ratio"] < 1 and "encoded" in a["model"]
    assert a["history"] != run_cli(tmp_path, *extra, "--seed", "1", name="c.json", topology="lossy-4")["history"]


def test_smaller_messages_make_shorter_rounds(tmp_path):
    """homogeneous-4 at 100 Mbit/s, BSP: a round's transfer shrinks with the message's bytes on the
    network (int8: a quarter; the filter: what it lets through)."""
    base = ["--eval-every", "0", "--eval-ms", "0", "--message-bytes", "1e6"]

    def transfer(result):
        return result["virtual_s"] - 48 * 0.002 - result["costs"]["merge_s"] * result["rounds"] * result["average_p"]

    dense = run_cli(tmp_path, *base, name="dense.json", topology="homogeneous-4")
    int8 = run_cli(tmp_path, *base, "--compress", "int8", name="int8.json", topology="homogeneous-4")
    assert int8["bytes_per_message"] == pytest.approx(1e6 * int8["bytes_ratio"])
    assert transfer(int8) == pytest.approx(transfer(dense) * int8["bytes_ratio"], rel=0.1)
    filtered = run_cli(tmp_path, *base, "--filter", "value", name="value.json", topology="homogeneous-4")
    assert filtered["bytes_ratio"] < 1 and transfer(filtered) < transfer(dense)


def test_the_planner_sees_each_peers_own_message_size():
    """With the value filter the peers' messages differ in size: each peer reports its own to the
    control plane, and the views that plan later rounds hold what they reported (as live: a round is
    planned from a view published from earlier rounds' reports)."""
    args = parser().parse_args(["train", "--topology", "topology/heterogeneous-4.json", *SMALL, "--filter", "value",
                                "--filter-init-scale", "3", "--message-bytes", "1e6"])
    reported: list[list[float]] = []
    planned_with = []

    class Recording(VirtualTraining):
        def _report(self, rnd, *flows_and_sizes):
            reported.append(list(flows_and_sizes[-1]))
            super()._report(rnd, *flows_and_sizes)

    run = Recording(Options.from_args(args), Settings(steps=48, step_s=0.002, eval_every=16), load(args.topology),
                    mnist1d(args.samples), lambda: make_model(args), "mlp-32")
    view_for = run.control.view_for
    run.control.view_for = lambda rnd: planned_with.append(view_for(rnd).message_bytes.tolist()) or view_for(rnd)
    result = run.run()
    assert len(reported) == len(planned_with) == result["rounds"] == 6
    assert any(len(set(sizes)) > 1 for sizes in reported)
    later = [sizes for sizes in planned_with if any(sizes)]
    assert later, "no view ever held a reported message size"
    assert all(sizes in reported for sizes in later), "a view holds sizes no round reported"
    assert np.mean(reported) == pytest.approx(result["bytes_per_message"]) and result["bytes_ratio"] < 1

