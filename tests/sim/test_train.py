"""p2plearn.sim train: virtual peers with real replicas on a simulated network."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from p2plearn.sim.__main__ import main
from p2plearn.sim.batches import peer_batches
from p2plearn.sim.links import LinkSchedule
from p2plearn.sim.replicas import Replicas
from p2plearn.topology import Topology, heterogeneous, microburst
from p2plearn.train.data import Dataset, dirichlet_shards, shard

SMALL = ["--compress", "none", "--model", "mlp", "--hidden", "32", "--samples", "4000", "--steps", "48", "--period", "8",
         "--batch-size", "32", "--eval-every", "16", "--step-ms", "2"]  # a later --step-ms wins


def run_cli(tmp_path, *extra: str, name: str = "out.json") -> dict:
    out = tmp_path / name
    assert main(["train", "--topology", "topology/heterogeneous-4.json", *SMALL, *extra, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_same_seed_same_run(tmp_path):
    """A run is a function of its flags and seed: accuracies, clocks and rounds are identical."""
    a = run_cli(tmp_path, "--sync", "ssp", "--compute-spread", "0.5", "--loss-bound", "0.05", name="a.json")
    b = run_cli(tmp_path, "--sync", "ssp", "--compute-spread", "0.5", "--loss-bound", "0.05", name="b.json")
    for key in ("history", "round_log", "virtual_s", "own_accuracy", "averaged_accuracy", "average_p"):
        assert a[key] == b[key], key
    c = run_cli(tmp_path, "--sync", "ssp", "--compute-spread", "0.5", "--loss-bound", "0.05", "--seed", "1",
                name="c.json")
    assert c["history"] != a["history"]


def test_result_says_which_message_size(tmp_path):
    own = run_cli(tmp_path, name="own.json")
    assert own["message_bytes"] == own["replica_bytes"] == own["parameters"] * 4
    assert own["message_bytes_source"] == "the replica's"
    big = run_cli(tmp_path, "--message-bytes", "4e6", name="big.json")
    assert big["message_bytes"] == 4e6 and big["message_bytes_source"] == "--message-bytes"
    # the same replicas, a 4 MB message on 12.5-250 Mbit/s links: the rounds take longer
    assert big["virtual_s"] > own["virtual_s"] + 6 * 4e6 / (250e6 / 8)


def test_colocated_peers_pay_their_rounds_and_receives_over_the_shared_cores(tmp_path, capsys):
    own = run_cli(tmp_path, name="own.json")
    shared = run_cli(tmp_path, "--colocate", "1", name="shared.json")  # 4 peers on one core
    assert "peers on hosts of their own" in own["model"]
    assert "4 peers on 1 host(s) of 1 core(s)" in shared["model"] and "x4" in shared["model"]
    # the rounds' fixed work and the receives (and the calibrated evaluations) take 4x as long
    assert shared["virtual_s"] > own["virtual_s"]
    assert [h[1] for h in shared["history"]] == [h[1] for h in own["history"]]  # the same training
    out = tmp_path / "refused.json"
    assert main(["train", "--topology", "topology/heterogeneous-4.json", *SMALL, "--colocate", "1", "--hosts", "0",
                 "--json", str(out)]) == 2
    assert "at least one host" in capsys.readouterr().err


def test_virtual_time_is_compute_plus_transfer(tmp_path):
    """homogeneous-4 at 100 Mbit/s, BSP, p = 1: each round's time is the period's compute plus a
    message at the pacing rate (what the flow simulator predicts for it), nothing else."""
    out = tmp_path / "h.json"
    assert main(["train", "--topology", "topology/homogeneous-4.json", *SMALL, "--eval-every", "0",
                 "--message-bytes", "1e6", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rounds = result["rounds"]
    assert rounds == 6
    compute = 48 * 0.002
    transfer = result["virtual_s"] - compute - result["costs"]["merge_s"] * rounds * result["average_p"]
    one = 1e6 * (1514 / 1416) / (100e6 / 8)  # a message's wire bytes at the link's rate
    assert one * rounds <= transfer <= 1.2 * one * rounds


@pytest.mark.parametrize("dirichlet", [None, 0.3])
def test_peer_batches_are_the_batches_shard_gives_each_rank(dirichlet):
    generator = torch.Generator().manual_seed(1)
    data = Dataset(torch.randn(333, 4, generator=generator), torch.randint(0, 10, (333,), generator=generator),
                   torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), 10)
    n, batch = 5, 8
    shards = None if dirichlet is None else torch.stack(dirichlet_shards(data.y, n, dirichlet, seed=3))
    for epoch in (0, 1):
        batches = peer_batches(len(data), batch, n, epoch, 3, shards)
        for rank in range(n):
            expected = list(shard(data, batch, rank=rank, world_size=n, epoch=epoch, seed=3, dirichlet=dirichlet))
            assert len(batches) == len(expected) > 0
            for idx, (x, y) in zip(batches[:, rank], expected):
                assert torch.equal(data.x[idx], x) and torch.equal(data.y[idx], y)


def test_bursts_apply_while_active():
    topology = microburst(4)
    links = LinkSchedule(topology)
    event = topology.events(topology.peers[0])[0]
    quiet = links.at(event.at_s - 0.01)
    during = links.at(event.at_s + event.duration_s / 2)
    assert during[1][0] < quiet[1][0] and during[2][0] > quiet[2][0]
    again = links.at(event.at_s + event.every_s + event.duration_s / 2)
    assert np.array_equal(again[1], during[1]) or event.every_s is None


def test_links_change_where_an_event_begins_or_ends():
    topology = microburst(4)
    links = LinkSchedule(topology)
    events = [topology.events(p)[0] for p in topology.peers]
    bounds = sorted({e.at_s + k * e.every_s + d for e in events for k in range(3) for d in (0.0, e.duration_s)})
    t, seen = 0.0, []
    while True:
        t = links.next_change(t)
        if t > bounds[-1]:
            break
        seen.append(t)
    assert seen == [b for b in bounds if b > 0.0]
    for t in seen:  # the links differ just before and just after each change
        before, after = links.at(t - 1e-6), links.at(t + 1e-6)
        assert not (np.array_equal(before[1], after[1]) and np.array_equal(before[2], after[2]))
    assert LinkSchedule(heterogeneous(4)).next_change(0.0) == np.inf


def test_a_change_rounded_short_by_the_rounds_start_is_taken_and_the_next_one_given():
    # 3.7 + (13.35 - 3.7) < 13.35 in floating point: a simulator at the change would be given it again
    topology = microburst(1, every_s=20.0, duration_s=0.5)
    topology = Topology.from_data({**topology.to_data(), "nodes": [
        {**topology.to_data()["nodes"][0], "events": [{"at_s": 13.35, "duration_s": 0.5, "downlink_mbit": 10.0}]}]})
    links = LinkSchedule(topology).from_time(3.7)
    _, quiet, change = links(0.0)
    assert 3.7 + change < 13.35  # the case
    _, down, after = links(change)
    assert after > change and after == pytest.approx(13.85 - 3.7) and down[0] < quiet[0]


def test_batched_replicas_step_as_one_after_another():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    batched = Replicas(model, 3, lr=0.1)
    sequential = Replicas(model, 3, lr=0.1, path="sequential")
    x, y = torch.randn(3, 4, 5), torch.randint(0, 3, (3, 4))
    for _ in range(3):
        batched.step(x, y)
        sequential.step(x, y)
    assert torch.allclose(batched.flat, sequential.flat, atol=1e-6)
    # and as torch's SGD steps one model
    reference = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    reference.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(x[1]), y[1]).backward()
        opt.step()
    assert torch.allclose(torch.nn.utils.parameters_to_vector(reference.parameters()), batched.flat[1], atol=1e-6)


def test_threads_change_the_wall_time_only(tmp_path, capsys):
    one = run_cli(tmp_path, "--sync", "ssp", name="one.json")
    two = run_cli(tmp_path, "--sync", "ssp", "--threads", "2", name="two.json")
    for key in ("history", "round_log", "virtual_s", "own_accuracy", "averaged_accuracy", "costs"):
        assert one[key] == two[key], key
    assert torch.get_num_threads() == 1  # the CLI's, restored after the run
    assert main(["train", "--topology", "topology/homogeneous-4.json", *SMALL, "--threads", "0"]) == 2
    assert "--threads 0" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--sync", "partitioned", "--tolerance", "layerwise"], ["--transport-mode", "multicast"],
                                  ["--overlap"], ["--tolerance", "layerwise", "--compress", "int8"]])
def test_refuses_what_it_does_not_simulate(tmp_path, flag, capsys):
    assert main(["train", "--topology", "topology/homogeneous-4.json", *SMALL, *flag]) == 2
    assert "not simulated yet" in capsys.readouterr().err


def test_help_is_the_manual():
    out = subprocess.run([sys.executable, "-m", "p2plearn.sim", "train", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for flag in ("--sync", "--period", "--selection", "--message-bytes", "--compute-spread", "--dirichlet"):
        assert flag in out


def test_ssp_hides_stragglers_that_bsp_waits_for(tmp_path):
    """The same steps with stragglers (--compute-spread): the slowest peer ends when its own steps
    do under both, but SSP's other peers wait only for the bound, so on average they end sooner."""
    bsp = run_cli(tmp_path, "--compute-spread", "0.8", "--step-ms", "20", name="bsp.json")
    ssp = run_cli(tmp_path, "--compute-spread", "0.8", "--step-ms", "20", "--sync", "ssp", "--staleness", "2",
                  name="ssp.json")
    assert ssp["mean_virtual_s"] < bsp["mean_virtual_s"] <= bsp["virtual_s"]
    assert ssp["virtual_s"] <= bsp["virtual_s"] * (1 + 1e-9)  # the same sums, added in another order
    assert ssp["rounds"] == bsp["rounds"] == 6


def test_loss_bound_closes_early_and_merges_partial_messages(tmp_path):
    """lossy-4 (1% loss): without a bound every message arrives whole (repairs cost time); with a
    5% bound the rounds close after the first pass and the merge takes the chunks that arrived."""
    flags = ["--topology", "topology/lossy-4.json", *SMALL, "--message-bytes", "2e6"]
    assert main(["train", *flags, "--json", str(tmp_path / "exact.json")]) == 0
    assert main(["train", *flags, "--loss-bound", "0.05", "--json", str(tmp_path / "bound.json")]) == 0
    exact, bound = (json.loads((tmp_path / f"{k}.json").read_text()) for k in ("exact", "bound"))
    assert exact["delivered"] == 1.0 and bound["delivered"] < 1.0
    assert bound["virtual_s"] < exact["virtual_s"]


def test_outer_optimizer_changes_the_models(tmp_path):
    plain = run_cli(tmp_path, name="plain.json")
    outer = run_cli(tmp_path, "--outer-lr", "0.7", "--outer-momentum", "0.9", name="outer.json")
    assert outer["history"] != plain["history"]
    assert outer["virtual_s"] == plain["virtual_s"]  # the outer step changes values, not the schedule


def test_the_run_shows_progress_and_takes_the_documented_path_from_anywhere(tmp_path, monkeypatch, capsys):
    """Issue 44: `p2plearn-sim train` printed nothing until its result, and its documented
    `topology/...` path worked from the repository's root only."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "-np", "4", "--topology", "topology/heterogeneous-4.json", *SMALL]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines[0].startswith("p2plearn-sim: 4 virtual peers of mlp-32 on heterogeneous-4: preparing"), err
    assert lines[1].startswith("p2plearn-sim: step 1/48 | round 0 |"), err  # at once, not at the end
    assert re.match(r"p2plearn-sim: step 48/48 \| round 6 \| virtual [\d.]+ s \| accuracy rank 0 [\d.]+ \|",
                    lines[-1]), err
    assert "4 virtual peers" in out  # the result stays on stdout
    assert main(["train", "--topology", "heterogeneous-4", *SMALL]) == 0  # a shipped topology's name
