"""Streaming rounds (--fragments F): round r carries fragment r mod F of the exchanged arrays.

The schedule and its balance; rounds with real engines and a real control plane (peers as
threads) against a plain numpy reference of per-fragment averaging and outer steps; the merge of
several rounds' messages (SSP); resume mid-period; the optimizer's schedule; refused flags; and,
slow, a launched MNIST-1D job."""
from __future__ import annotations

import itertools
import json
import os
import secrets
import subprocess
import sys

import numpy as np
import pytest
import torch

from p2plearn.control import Coordinator
from p2plearn.options import Options, OptionsError
from p2plearn.sync import BSP, SSP, Partitioned
from p2plearn.sync.fragments import Fragments, balanced_cuts, fragment_pieces
from p2plearn.tolerance import Layer
from p2plearn.train.optimizer import layers_on_pieces
from p2plearn.sync.outer import OuterOptimizer
from p2plearn.topology import homogeneous, save
from p2plearn.transport import Delivery, Reason
from tests.sync.test_rounds import JOB, Peer, merge, run_threads
from tests.train.conftest import in_process_job, on_peers
from tests.train.test_schedule import local_step, mlp, params

SIZES = [600, 200, 300, 500]  # float32 arrays: 2400, 800, 1200, 2000 bytes; F = 2 cuts after the second


# -- the schedule ----------------------------------------------------------------------------------

@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_a_fragment_schedule_covers_every_array_exactly_once_per_period(count):
    rng = np.random.default_rng(count)
    nbytes = [int(b) for b in rng.integers(1, 10_000, size=7)]
    fragments = Fragments(nbytes, count)
    assert sorted(itertools.chain(*fragments.groups)) == list(range(7))
    assert all(group == list(range(group[0], group[-1] + 1)) for group in fragments.groups), "not in model order"
    for first in (0, 1, 13):  # any F consecutive rounds, from any clock (a joiner's, a resumed peer's)
        carried = [t for rnd in range(first, first + count) for t in fragments.arrays(rnd)]
        assert sorted(carried) == list(range(7)), f"rounds {first}..{first + count - 1} carried {carried}"
    assert fragments.arrays(4 * count + 1) == fragments.groups[1 % count]


def test_fragments_are_balanced_in_bytes_as_well_as_any_cut_allows():
    rng = np.random.default_rng(0)
    for _ in range(30):
        n = int(rng.integers(1, 8))
        sizes = [int(s) for s in rng.integers(1, 1000, size=n)]
        for count in range(1, n + 1):
            best = min(max(sum(sizes[a:b]) for a, b in zip((0, *cuts), (*cuts, n)))
                       for cuts in itertools.combinations(range(1, n), count - 1))
            fragments = Fragments(sizes, count)
            assert max(fragments.nbytes) == best, (sizes, count, fragments.groups)
            assert all(fragments.groups)
    assert balanced_cuts([4, 1, 1, 1, 1], 2) == [0, 1]  # 4 | 4


def test_fewer_arrays_than_fragments_are_refused():
    with pytest.raises(ValueError, match=r"--fragments 3: 2 array\(s\) of .* MiB in all.*at most 2 fragments"):
        Fragments([4000, 4000], 3)
    with pytest.raises(ValueError, match="--fragments must be >= 1, got 0"):
        Fragments([4000], 0)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
def test_arrays_cut_into_pieces_make_fragments_equal_to_an_element(count):
    nbytes, itemsizes = [9_437_184, 245_760, 6_144, 40, 24_000, 20], [4, 4, 4, 4, 2, 2]  # one dominant matrix
    pieces = fragment_pieces(nbytes, itemsizes, count)
    for a, (size, item) in enumerate(zip(nbytes, itemsizes)):  # the pieces tile every array, in order
        mine = [(lo, hi) for b, lo, hi in pieces if b == a]
        assert mine[0][0] == 0 and mine[-1][1] == size // item and all(
            hi == lo2 and lo < hi for (lo, hi), (lo2, _) in zip(mine, mine[1:] + [(size // item, 0)]))
    assert len(pieces) <= len(nbytes) + count - 1  # cut only where a share ends
    fragments = Fragments([(hi - lo) * itemsizes[a] for a, lo, hi in pieces], count)
    assert max(fragments.nbytes) - min(fragments.nbytes) <= 2 * max(itemsizes)
    assert fragment_pieces(nbytes, itemsizes, 1) == [(a, 0, s // i) for a, (s, i) in enumerate(zip(nbytes, itemsizes))]


def test_a_tensor_cut_between_pieces_is_one_layer_per_part_at_its_place_in_each():
    layers = [Layer("w", 100, 400, 0), Layer("b", 10, 40, 1, "bias"), Layer("v", 30, 60, 2)]
    ranges = [(0, 0, 100), (0, 100, 110), (1, 0, 30)]  # w and b in bucket 0 (float32), v in bucket 1 (half)
    pieces = [(0, 0, 60), (0, 60, 110), (1, 0, 30)]
    got, got_ranges = layers_on_pieces(layers, ranges, pieces)
    assert [(x.name, x.numel, x.nbytes, x.kind) for x in got] == [
        ("w[0:60]", 60, 240, "weight"), ("w[60:100]", 40, 160, "weight"), ("b", 10, 40, "bias"), ("v", 30, 60, "weight")]
    assert got_ranges == [(0, 0, 60), (1, 0, 40), (1, 40, 50), (2, 0, 30)]


def test_bad_flags_are_refused_in_one_line():
    with pytest.raises(OptionsError, match=r"^--fragments: --period \(6\) must be a multiple of --fragments \(4\)"):
        Options(period=6, fragments=4)
    with pytest.raises(OptionsError, match=r"^--fragments: must be in 1\.\.1024 \(got 0\)"):
        Options(fragments=0)
    with pytest.raises(OptionsError, match=r"^--fragments: must be in 1\.\.1024 \(got '0' from P2PLEARN_FRAGMENTS\)"):
        Options.from_env({"P2PLEARN_FRAGMENTS": "0"})
    with pytest.raises(OptionsError, match=r"^--fragments: does not apply with --filter value"):
        Options(period=4, fragments=2, filter="value")
    assert Options(period=8, fragments=4).fragments == 4


def test_the_simulator_refuses_fragments():
    from p2plearn.sim.train import VirtualTraining

    with pytest.raises(ValueError, match="--fragments 2: not simulated yet"):
        VirtualTraining(Options(period=4, fragments=2), None, None, None, None, "mlp")


# -- rounds over real channels ----------------------------------------------------------------------

def fragment_params(rank: int) -> list[np.ndarray]:
    """len(SIZES) arrays of rank-dependent values, multiples of 1/64: sums of a few are exact, so the
    reference's mean is the merge's to the bit."""
    rng = np.random.default_rng(rank)
    return [(rng.integers(-640, 640, size=n) / 64).astype(np.float32) for n in SIZES]


@pytest.fixture
def jobs():
    """jobs(n, cls, outer=(lr, momentum) or None, **kw) -> n peers of a new in-process job (each call
    its own coordinator), each with an outer optimizer of its own; everything is closed after the
    test, also on failure."""
    made: list[tuple[Coordinator, list[Peer]]] = []

    def make(n: int, cls, outer: tuple[float, float] | None = None, **kw) -> list[Peer]:
        key = secrets.token_hex(16)
        coord = Coordinator(JOB, key, heartbeat=0.2, startup_grace=1.0).start()
        peers: list[Peer] = []
        made.append((coord, peers))
        peers.extend(Peer(r, coord, key, cls, params=fragment_params(r), outer=OuterOptimizer(*outer) if outer else None,
                          **dict(kw)) for r in range(n))
        for p in peers:
            p.client.wait_members(n, 5.0, receiving=True)
        return peers

    yield make
    for coord, peers in made:
        for p in peers:
            p.close()
        coord.stop()


def local_change(rank: int, rnd: int, arrays: list[np.ndarray]) -> None:
    """A peer's 'local steps' before round `rnd`: its own change to every array (multiples of 1/64)."""
    rng = np.random.default_rng(1000 * rank + rnd)
    for a in arrays:
        a += (rng.integers(-64, 64, size=a.size) / 64).astype(np.float32)


def reference(models: list[list[np.ndarray]], rounds: int, groups: list[list[int]], lr: float, momentum: float,
              first: int = 0) -> list[list[np.ndarray]]:
    """What the peers hold after rounds first..first+rounds-1 of exact all-to-all averaging of
    fragment r mod F, each followed by the DiLoCo outer step on that fragment, in plain numpy."""
    models = [[a.copy() for a in m] for m in models]
    anchors = [[a.copy() for a in m] for m in models]
    buffers = [[np.zeros_like(a) for a in m] for m in models]
    for rnd in range(first, first + rounds):
        for rank, m in enumerate(models):
            local_change(rank, rnd, m)
        for i in groups[rnd % len(groups)]:
            mean = (sum(m[i].astype(np.float64) for m in models) / len(models)).astype(np.float32)
            for rank, m in enumerate(models):
                m[i] = mean.copy()
                if (lr, momentum) != (1.0, 0.0):
                    change = mean - anchors[rank][i]
                    buffers[rank][i] = buffers[rank][i] * momentum + change
                    change = change + momentum * buffers[rank][i]
                    m[i] = anchors[rank][i] + lr * change
                anchors[rank][i] = m[i].copy()
    return models


@pytest.mark.parametrize("cls,kw", [(BSP, {}), (SSP, {"staleness": 0}), (Partitioned, {})], ids=["bsp", "ssp0", "partitioned"])
@pytest.mark.parametrize("count", [1, 2])
def test_each_round_averages_its_fragment_and_leaves_the_others_local(jobs, cls, kw, count):
    """Three peers, 5 rounds with local changes between them and DiLoCo's outer step: the same bits
    as the reference, F = 1 (every array every round, as without fragments) and F = 2."""
    peers = jobs(3, cls, fragments=count, outer=(0.7, 0.9), **kw)
    starts = [[a.copy() for a in p.params] for p in peers]
    sent: dict[int, list[int]] = {}
    run_threads(peers, 5, before_step=lambda p: local_change(p.client.rank, p.sync.clock, p.params),
                after_step=lambda rs: sent.setdefault(rs.round, []).append(rs.bytes_sent))
    groups = peers[0].sync.fragments.groups
    assert groups == ([[0, 1, 2, 3]] if count == 1 else [[0, 1], [2, 3]])
    want = reference(starts, 5, groups, 0.7, 0.9)
    for p, expected in zip(peers, want):
        assert p.sync.clock == 5
        for i, (got, w) in enumerate(zip(p.params, expected)):
            np.testing.assert_array_equal(got, w, err_msg=f"rank {p.client.rank}, array {i}")
    if cls is BSP:  # each uplink carries its round's fragment to the 2 others: 1/F of the model per round
        for rnd, each in sent.items():
            assert each == [2 * 4 * sum(SIZES[i] for i in groups[rnd % count])] * 3


def test_a_round_touches_only_its_fragments_anchors_momentum_and_compression_residuals(jobs):
    peers = jobs(2, BSP, fragments=2, compress="int8", outer=(0.7, 0.9))
    before = [[a.copy() for a in p.sync._previous] for p in peers]
    run_threads(peers, 1, before_step=lambda p: local_change(p.client.rank, p.sync.clock, p.params))
    for p, anchors in zip(peers, before):
        # fragment 0 (arrays 0, 1) was sent, merged and stepped; arrays 2, 3 are as the local change left them
        for i in (0, 1):
            np.testing.assert_array_equal(p.sync._previous[i], p.params[i])
            assert np.any(p.sync.outer.buffers[i] != 0)
            assert np.any(p.sync.compressor.residuals[i] != 0)
        for i in (2, 3):
            np.testing.assert_array_equal(p.sync._previous[i], anchors[i])
            assert not np.any(p.sync.outer.buffers[i]) and not np.any(p.sync.compressor.residuals[i])
            assert not np.array_equal(p.params[i], anchors[i])  # local, not rolled back


def test_several_rounds_merged_at_once_each_go_into_their_own_fragment(jobs):
    """SSP merges the messages of rounds r-s..r together: round 0's (fragment 0) and round 1's
    (fragment 1) from one sender land in their own arrays only."""
    (peer,) = jobs(1, SSP, fragments=2, staleness=1)
    own = [a.copy() for a in peer.params]

    def delivery(rnd: int, value: float) -> Delivery:
        arrays = [np.full(SIZES[i], value, np.float32) for i in peer.sync.fragments.arrays(rnd)]
        return Delivery(sender=1, msg_id=rnd, arrays=arrays, mask=np.ones(3, bool), reason=Reason.COMPLETE,
                        source=("", 0), fractions=[1.0] * len(arrays))

    merged, delivered = merge(peer.sync, 1, [delivery(0, 4.0), delivery(1, -8.0)])
    assert (merged, delivered) == (2, 1.0)
    for i, want in enumerate([(own[0] + 4) / 2, (own[1] + 4) / 2, (own[2] - 8) / 2, (own[3] - 8) / 2]):
        np.testing.assert_array_equal(peer.params[i], want.astype(np.float32))
    # a message of round 2 (fragment 0 again) does not fit fragment 1's arrays: it is not merged
    wrong = delivery(1, 1.0)
    wrong.msg_id = 2
    assert merge(peer.sync, 2, [wrong]) == (0, 1.0)
    assert peer.sync.inbox.drops == {"unmergeable: not this model's message": 1}


@pytest.mark.parametrize("compress", ["none", "int8", "int4"])
def test_resume_from_state_dict_mid_period_continues_bit_for_bit(jobs, compress):
    """Three rounds (F = 2: the period's second half is next), state_dict, a new job of new peers
    that load it: after three more rounds they hold what an uninterrupted job's peers hold."""
    kw = {"fragments": 2, "compress": compress, "outer": (0.7, 0.9)}

    def run(peers, rounds):
        run_threads(peers, rounds, before_step=lambda p: local_change(p.client.rank, p.sync.clock, p.params))

    whole = jobs(2, BSP, **kw)
    run(whole, 6)
    first = jobs(2, BSP, **kw)
    run(first, 3)
    saved = [(p.sync.state_dict(), [a.copy() for a in p.params]) for p in first]
    resumed = jobs(2, BSP, **kw)
    for p, (state, model) in zip(resumed, saved):
        for own, a in zip(p.params, model):
            own[...] = a
        p.sync.load_state_dict(state)
        assert p.sync.clock == 3 and p.sync.fragments.arrays(p.sync.clock) == [2, 3]
    run(resumed, 3)
    for a, b in zip(whole, resumed):
        for i, (x, y) in enumerate(zip(a.params, b.params)):
            np.testing.assert_array_equal(x, y, err_msg=f"rank {a.client.rank}, array {i}")


def test_a_synchronizer_refuses_fragments_with_the_value_filter_or_too_few_arrays(jobs):
    from p2plearn.filter import make_filter

    with pytest.raises(ValueError, match="--fragments: does not apply with --filter value"):
        jobs(1, BSP, fragments=2, value_filter=make_filter("value"))
    with pytest.raises(ValueError, match="at most 4 fragments"):
        jobs(1, BSP, fragments=5)


# -- through the optimizer -------------------------------------------------------------------------

@pytest.fixture
def job():
    with in_process_job(2) as made:
        yield made


TINY_BUCKETS = 1e-6  # MiB: every tensor its own bucket (the MLP's four: 512, 64, 192 and 12 bytes)


@pytest.mark.parametrize("mode", [{"sync": "bsp"}, {"sync": "ssp", "staleness": 0}, {"sync": "partitioned"},
                                  {"sync": "bsp", "overlap": True}, {"sync": "bsp", "overlap_steps": 1, "overlap_alpha": 1.0}],
                         ids=["bsp", "ssp0", "partitioned", "overlap", "overlap-mixed"])
def test_the_optimizer_runs_a_round_every_period_over_F_steps_each_on_its_fragment(job, mode):
    starts = [mlp(1), mlp(2)]

    def body(rank, opt):
        opt.model.load_state_dict(starts[rank].state_dict())
        seen = []
        for _ in range(4):  # lr 0: only the rounds move the model; period 4, F 2: rounds after steps 2 and 4
            opt.step()
            if opt.steps % 2 == 0:
                opt.flush()  # an overlapped round in flight lands now
                seen.append((opt.sync.clock, params(opt.model), opt.last_round.bytes_sent))
        return seen, opt.stats().rounds

    results = on_peers(job, [mlp(), mlp()], body, make_inner=lambda m: torch.optim.SGD(m.parameters(), lr=0.0),
                       period=4, fragments=2, bucket_mb=TINY_BUCKETS, **mode)
    flat = lambda tensors: torch.cat([t.reshape(-1) for t in tensors])  # noqa: E731 - the model's order
    average = (flat(starts[0].parameters()) + flat(starts[1].parameters())) / 2
    for rank, (seen, rounds) in enumerate(results):
        assert rounds == 2 and [clock for clock, _, _ in seen] == [1, 2]
        own = flat(starts[rank].parameters())
        (_, half, _), (_, full, _) = seen
        # fragment 0: the first 390 of the model's 780 bytes, 97 elements of the first weight (128)
        torch.testing.assert_close(flat(half)[:97], average[:97])
        assert torch.equal(flat(half)[97:], own[97:]), "an element outside the round's fragment changed"
        torch.testing.assert_close(flat(full), average)
        if mode == {"sync": "bsp"}:  # one receiver: the round's fragment, once
            assert [sent for _, _, sent in seen] == [388, 392]


def test_a_model_in_one_bucket_is_cut_into_equal_fragments(job):
    """The default --bucket-mb packs the MLP into one bucket: F = 2 fragments of 390 bytes each,
    the first inside the first weight; round 0 averages exactly those elements."""
    starts = [mlp(1), mlp(2)]

    def body(rank, opt):
        opt.model.load_state_dict(starts[rank].state_dict())
        opt.step()
        opt.step()
        return opt.sync.fragments.nbytes, [p.size for p in opt.sync.params], params(opt.model)

    results = on_peers(job, [mlp(), mlp()], body, make_inner=lambda m: torch.optim.SGD(m.parameters(), lr=0.0),
                       period=4, fragments=2)
    flat = lambda tensors: torch.cat([t.reshape(-1) for t in tensors])  # noqa: E731
    average = (flat(starts[0].parameters()) + flat(starts[1].parameters())) / 2
    for rank, (nbytes, sizes, got) in enumerate(results):
        assert nbytes == [388, 392] and sizes == [97, 98]
        torch.testing.assert_close(flat(got)[:97], average[:97])
        assert torch.equal(flat(got)[97:], flat(starts[rank].parameters())[97:])


def test_steps_and_clock_convert_with_period_over_F(job):
    """A state without its step count (the checkpoint default) resumes at clock x period/F steps;
    the next round is after period/F steps more and carries the clock's fragment."""
    def body(rank, opt):
        own = opt.sync.state_dict()
        own.pop("steps", None)
        own["clock"] = 3
        opt.load_state_dict({**opt.optimizer.state_dict(), "p2plearn": own})
        assert opt.steps == 6 and opt.round_steps == 2
        local_step(opt, rank)
        assert opt.last_round is None
        local_step(opt, 10 + rank)
        return opt.last_round.round, opt.sync.fragments.arrays(opt.last_round.round)

    # pieces: the first weight cut at element 97 (0, 1), then b1, w2, b2: fragment 1 is pieces 1-4
    assert on_peers(job, [mlp(), mlp()], body, period=4, fragments=2, bucket_mb=TINY_BUCKETS) == [(3, [1, 2, 3, 4])] * 2


# -- end to end ------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(900)
def test_three_launched_peers_train_mnist1d_with_two_fragments(tmp_path):
    topo = tmp_path / "homogeneous-3.json"
    save(homogeneous(3, mbit=1000), topo)
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "p2plearn.launch", "-np", "3", "--topology", str(topo), "--emulate",
           "--period", "4", "--fragments", "2", "--bucket-mb", "0.02",  # the CNN's 40 kB in 3 buckets
           "--", sys.executable, "-m", "p2plearn.examples.mnist1d", "--epochs", "3", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    print(f"averaged {result['averaged_accuracy']:.3f} in {result['wall_s']:.1f} s")
    assert result["averaged_accuracy"] >= 0.8
