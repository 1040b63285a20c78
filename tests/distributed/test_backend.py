"""The p2plearn torch.distributed backend, multi-process, against gloo in the same job: on the CPU,
on the CPU through the device path (``P2PLEARN_STAGING=host``: host copies of every tensor), and
on a GPU where CUDA is (skipped elsewhere)."""
import signal
from pathlib import Path

import pytest
import torch

from p2plearn.distributed.collectives import AHEAD
from tests.distributed.job import run_job, run_ranks

pytestmark = pytest.mark.slow  # each job starts its ranks' torch (seconds on a busy machine)


STAGED = {"P2PLEARN_STAGING": "host"}
CUDA = pytest.param({"P2PLEARN_TEST_DEVICE": "cuda"}, id="cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (no GPU on this machine)"))
DEVICES = [pytest.param({}, id="cpu"), pytest.param(STAGED, id="staged"), CUDA]


@pytest.mark.parametrize("env", DEVICES)
def test_collectives_match_gloo(tmp_path, env):
    for rank, result in enumerate(run_job(tmp_path, "collectives", world_size=3, env=env)):
        assert result.pop("backend") == "p2plearn"
        unsupported = result.pop("unsupported")
        assert unsupported == "the p2plearn backend does not implement recv_anysource", unsupported
        assert all(result.values()), (rank, result)


@pytest.mark.parametrize("env", DEVICES)
@pytest.mark.parametrize("scenario", ["ddp", "ddp_hook", "ddp_hadamard"])
def test_ddp_trains_as_over_gloo(tmp_path, scenario, env):
    for rank, result in enumerate(run_job(tmp_path, scenario, world_size=2, env=env)):
        assert result["start_equal"] and result["moved"], (rank, result)
        assert result["trained_equal"], (rank, result)
        if scenario != "ddp":
            assert result["buckets"] > 1 and result["delivered"] == 1.0, result


@pytest.mark.parametrize("env", DEVICES)
def test_point_to_point_as_over_gloo(tmp_path, env):
    expected = [{"ring", "batch_isend_irecv", "send_first"}, {"ring", "batch_isend_irecv", "in_order", "tags"},
                {"ring", "batch_isend_irecv", "receive_first"}]
    for rank, result in enumerate(run_job(tmp_path, "point_to_point", world_size=3, env=env)):
        assert result.pop("backend") == "p2plearn"
        assert set(result) == expected[rank] and all(result.values()), (rank, result)


@pytest.mark.parametrize("topology", [None, "heterogeneous-4"])
def test_the_world_paces_its_collectives_at_its_links_rates(tmp_path, topology):
    """Rank 0 reads every rank's rates from its view once all are members: the topology's, else the
    line rate of the interface each registered from (loopback's here). Read before this rank had
    registered (a regression), a view without a topology held no rates: every link was paced at the
    1 Gbit/s default, a 16.8 MB all-reduce of 4 ranks on loopback took 232 ms instead of 50."""
    from p2plearn.control.estimator import rates_from_file
    from p2plearn.transport.nic import LOOPBACK_RATE

    env = {}
    if topology is None:
        expected = {"uplink": [LOOPBACK_RATE] * 4, "downlink": [LOOPBACK_RATE] * 4}
    else:
        env["P2PLEARN_TOPOLOGY"] = str(Path(__file__).resolve().parents[2] / "topology" / f"{topology}.json")
        rates = rates_from_file(env["P2PLEARN_TOPOLOGY"])
        expected = {"uplink": [rates[r][0] for r in range(4)], "downlink": [rates[r][1] for r in range(4)]}
    for rank, result in enumerate(run_job(tmp_path, "links", world_size=4, env=env)):
        assert {k: result[k] for k in expected} == expected, (rank, result)


def test_a_pipeline_trains_as_over_gloo(tmp_path):
    for rank, result in enumerate(run_job(tmp_path, "pipeline", world_size=2)):
        assert result["losses_equal"] and result["trained_equal"], (rank, result)


@pytest.mark.parametrize("env", DEVICES)
def test_subgroups_compute_as_over_gloo(tmp_path, env):
    for rank, result in enumerate(run_job(tmp_path, "subgroups", world_size=4, env=env)):
        assert result.pop("backend") == "p2plearn"
        assert all(result.values()) and len(result) == 12 + (rank > 0), (rank, result)


def test_fsdp_trains_as_over_gloo(tmp_path):
    """The collectives' numpy views must leave a tensor's storage resizable (Tensor.numpy() does not:
    FSDP's first backward failed, "Trying to resize storage that is not resizable")."""
    for rank, result in enumerate(run_job(tmp_path, "fsdp", world_size=2)):
        assert result["trained_equal"], (rank, result)


def test_fully_shard_trains_as_over_gloo(tmp_path):
    for rank, result in enumerate(run_job(tmp_path, "fsdp2", world_size=2)):
        assert result["trained_equal"], (rank, result)


def test_post_local_sgd_matches_gloo(tmp_path):
    for rank, result in enumerate(run_job(tmp_path, "post_local_sgd", world_size=2)):
        assert result["equal_to_gloo"], (rank, result)
    assert result["ranks_differ"]  # steps after the last average are local: the check is not vacuous


def test_distributed_checkpoint_saves_and_loads(tmp_path):
    assert all(result["restored"] for result in run_job(tmp_path, "checkpoint", world_size=2))


def test_a_failed_collective_raises_as_over_gloo(tmp_path):
    """Rank 0 all-reduces 8 elements, rank 1 three: gloo raises (or aborts the process), and so does
    p2plearn: wait(), the synchronous call and every later collective of the failed group."""
    results, codes, logs = run_ranks(tmp_path, "mismatch", world_size=2, timeout=180)
    assert all(r is not None for r in results), logs
    for rank, result in enumerate(results):
        ours = result["p2plearn"]
        for call in ("async", "sync", "after"):
            assert "DistBackendError" in ours[call]["raised"], (rank, call, ours)
        assert ours["after_success"] is False
        assert "failed before" in ours["after"]["message"]
    # every rank names the cause: the rank with other shapes, or the one that left over them
    messages = [r["p2plearn"]["async"]["message"] for r in results]
    assert any("shapes" in m for m in messages) and all("rank" in m for m in messages), messages
    assert all(r["p2plearn"]["async"]["seconds"] < 60 for r in results)  # not the group's 30 minutes
    # gloo: a rank raises, the other aborts at the mismatch
    gloo_raised = [r for r, result in enumerate(results) if result.get("gloo", {}).get("async", {}).get("raised")]
    assert gloo_raised or any(code not in (0, None) for code in codes), logs


def survivor_of_a_killed_rank(tmp_path, scenario: str, raised: str) -> dict:
    """Rank 0's result after rank 1 was killed: gloo's call raised, and so did p2plearn's (``raised``
    among its error's classes, naming rank 1, at the membership's verdict, not the 30-minute timeout)."""
    results, codes, logs = run_ranks(tmp_path, scenario, world_size=2, timeout=180)
    assert codes[1] == -signal.SIGKILL and codes[0] == 0, logs
    survivor = results[0]
    assert "RuntimeError" in survivor["gloo"]["raised"], survivor
    assert raised in survivor["p2plearn"]["raised"], survivor
    assert "rank 1" in survivor["p2plearn"]["message"], survivor
    assert survivor["p2plearn"]["seconds"] < 30, survivor
    return survivor


def test_a_dead_rank_fails_the_survivors_collectives_as_over_gloo(tmp_path):
    survivor_of_a_killed_rank(tmp_path, "dead_rank", "DistBackendError")


def test_a_dead_rank_fails_a_receive_from_it_as_over_gloo(tmp_path):
    survivor_of_a_killed_rank(tmp_path, "dead_rank_p2p", "DistBackendError")


def test_a_dead_rank_fails_a_subgroups_collectives_as_over_gloo(tmp_path):
    survivor = survivor_of_a_killed_rank(tmp_path, "dead_rank_subgroup", "DistBackendError")
    assert "failed before" in survivor["world_after"]["message"], survivor  # the rank's world group too


def test_ddp_backward_raises_when_a_rank_died_as_over_gloo(tmp_path):
    """DDP's reducer reads a collective's future from C++: a failed all-reduce must complete it
    with an error there (a torch future's set_exception only stores the error as its value: read
    as the outputs, the reducer crashed the survivor with a segmentation fault)."""
    survivor = survivor_of_a_killed_rank(tmp_path, "dead_rank_ddp", "RuntimeError")
    assert "RuntimeError" in survivor["p2plearn_hook"]["raised"], survivor  # the group failed before it
    assert "failed before" in survivor["p2plearn_hook"]["message"], survivor


def test_destroy_process_group_keeps_the_engine_answering_until_the_others_left(tmp_path):
    """A rank that finished its collectives and destroyed its group still acknowledges what the
    others send it (a retransmission after lost acknowledgements, on a lossy link: closed at once,
    its silence failed their last collective), and returns once they left, not after a timeout."""
    from p2plearn.transport import ANSWER_LINGER_S

    first, second = run_job(tmp_path, "linger", world_size=2, timeout=120)
    assert first["probe"] == {"result": "exact", "delivered": 1.0}, first
    assert second["destroy_ended"] > first["destroy_began"], (first, second)  # it waited for rank 0's leave
    assert second["destroy_ended"] - second["destroy_began"] < ANSWER_LINGER_S, second  # not the linger's bound


def test_a_member_forging_another_ranks_messages_neither_stops_nor_bloats_a_peer(tmp_path):
    # the job's largest message sized to the job (P2PLEARN_MAX_MESSAGE_MB): what the engine may hold
    # for the victim is then a few MB, as is what its group keeps of collectives ahead
    results = run_job(tmp_path, "forged", world_size=2, timeout=300, env={"P2PLEARN_MAX_MESSAGE_MB": "4"})
    victim, forger = results
    assert forger["forged_mb"] > 100, forger["forged_mb"]
    assert victim["trained_equal"] and victim["moved"], victim
    refused = victim["stats"]["refused"]
    assert refused.get("shapes or dtypes of another collective", 0) > 0, refused
    assert refused.get(f"more than {AHEAD} collectives ahead", 0) > 0, refused
    # kept, the messages far ahead grew the victim by their total; now by about what the same
    # training grows the rank that sent them
    assert victim["rss_growth_mb"] < forger["rss_growth_mb"] + 50, (victim, forger["rss_growth_mb"])
