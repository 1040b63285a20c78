"""p2plearn.sync.codec: the bytes a round puts on the wire and the models it merges, pinned.

Two peers run three BSP rounds through real engines with a fixed seed, each in one of the three
message formats (plain values cut by per-layer bounds, int8, value-filtered); what every send carried
(dtypes, shapes, bytes, loss bounds) and every model after the rounds are hashed and compared with the
hashes the code gave before the codec moved out of `Synchronizer`: a change of either is a change of
the wire format or of the merge, not a refactor."""
from __future__ import annotations

import hashlib
import secrets

import numpy as np
import pytest

from p2plearn.control import Client, Coordinator
from p2plearn.filter import ValueFilter
from p2plearn.sim.messages import virtual_delivery
from p2plearn.sync import BSP, MessageCodec
from p2plearn.tolerance import Layer, TolerancePolicy
from p2plearn.transport import Channel
from tests.sync.test_rounds import run_threads

JOB = "codec-test"

ROUNDS = 3
# three layers over two arrays: array 0 holds layers 0 and 1, array 1 holds layer 2
LAYER_RANGES = [(0, 0, 300), (0, 300, 700), (1, 0, 37)]


class DistinctBounds(TolerancePolicy):
    """Per-layer bounds that differ (so a plain message is cut into segments at layer 1) yet lose
    nothing: 1e-9 of a message is less than a chunk, so every chunk must arrive (a fixed round)."""

    name = "distinct"

    def bounds(self, round, layers, network, training):
        return [0.0, 1e-9, 0.0], None

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def params_of(rank: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + rank)
    return [rng.standard_normal(700).astype(np.float32), rng.standard_normal(37).astype(np.float32)]


def local_step(peer) -> None:
    """A deterministic local change per rank and round (heavy-tailed, as SGD's are)."""
    rng = np.random.default_rng(1000 * peer.client.rank + peer.sync.clock)
    for p in peer.params:
        p += rng.laplace(0.0, 0.01, p.shape).astype(np.float32)


def record_sends(peer, log: list) -> None:
    """Hash what each send hands the engine (the engine reads the arrays in place, so now)."""
    send = peer.channel.send

    def recording(msg_id, arrays, receivers, **kw):
        digest = hashlib.sha256()
        for a in arrays:
            digest.update(f"{a.dtype.str}{a.shape}".encode())
            digest.update(np.ascontiguousarray(a).tobytes())
        digest.update(repr([float(b) for b in kw["loss_bounds"]]).encode())
        log.append((peer.client.rank, msg_id, digest.hexdigest()))
        return send(msg_id, arrays, receivers, **kw)

    peer.channel.send = recording


def fingerprint(peers, sends) -> str:
    digest = hashlib.sha256()
    for rank, msg_id, sent in sorted(sends):
        digest.update(f"{rank}:{msg_id}:{sent};".encode())
    for peer in peers:
        for p in peer.params:
            digest.update(p.tobytes())
    return digest.hexdigest()[:16]


PINNED = {
    "plain": "569b68a852f55f22",
    "int8": "475fe437fa8a2eb6",
    "filtered": "1b820e5f764123aa",
}


class Peer:
    """A peer of the pinned job: a real engine and control client, its own synchronizer."""

    def __init__(self, rank: int, coordinator: Coordinator, key: str, fmt: str):
        self.channel = Channel(sender_id=rank)
        self.client = Client(coordinator.address, JOB, key, rank=rank, connect_timeout=5.0)
        self.client.register(self.channel.address)
        self.params = params_of(rank)
        layers = [Layer(f"l{i}", hi - lo, 4 * (hi - lo), i) for i, (_, lo, hi) in enumerate(LAYER_RANGES)]
        kw = {"compress": "int8"} if fmt == "int8" else \
            {"value_filter": ValueFilter("per_element", init=0.02)} if fmt == "filtered" else {}
        self.sync = BSP(self.params, layers, self.channel, self.client, selection="all", fanout=1, seed=0,
                        tolerance=DistinctBounds(), layer_ranges=LAYER_RANGES, **kw)

    def close(self) -> None:
        self.client.close()
        self.channel.close()


@pytest.mark.parametrize("fmt", ["plain", "int8", "filtered"])
def test_a_fixed_seed_round_sends_and_merges_what_it_always_did(fmt):
    key = secrets.token_hex(16)
    coordinator = Coordinator(JOB, key, heartbeat=0.2, startup_grace=1.0).start()
    peers: list[Peer] = []
    try:  # (not the job fixture of test_rounds: these peers have layers of their own, and their policy)
        for rank in range(2):
            peers.append(Peer(rank, coordinator, key, fmt))
        for peer in peers:
            peer.client.wait_members(2, 5.0, receiving=True)
        sends: list = []
        for peer in peers:
            record_sends(peer, sends)
        run_threads(peers, ROUNDS, before_step=local_step)
        assert all(peer.sync.clock == ROUNDS for peer in peers)
        assert fingerprint(peers, sends) == PINNED[fmt]
    finally:
        for peer in peers:
            peer.close()
        coordinator.stop()


def test_a_plain_message_cut_by_its_bounds_reads_back_whole_and_another_models_is_refused():
    model = params_of(0)
    codec = MessageCodec(model, LAYER_RANGES)
    arrays, bounds = codec.wire(codec.encode(0, [0, 1]), [0.0, 0.1, 0.0])
    assert [a.size for a in arrays] == [300, 400, 37] and bounds == [0.0, 0.1, 0.0]
    d = virtual_delivery(1, 0, arrays, [b == 0.0 for b in bounds], 1.0, np.random.default_rng(0), 1.0)
    contributions, problem = codec.read(d)
    assert problem is None and [c.values.tolist() for c in contributions] == [a.tolist() for a in model]
    other = MessageCodec([np.zeros(701, np.float32), model[1]], [(0, 0, 701), (1, 0, 37)])
    assert other.read(d) == (None, "unmergeable: not this model's message")
