"""The p2plearn torch.distributed backend, multi-process on the CPU, against gloo in the same job."""
import pytest

from tests.distributed.job import run_job

pytestmark = pytest.mark.slow  # each job starts its ranks' torch (seconds on a busy machine)


def test_collectives_match_gloo(tmp_path):
    for rank, result in enumerate(run_job(tmp_path, "collectives", world_size=3)):
        assert result.pop("backend") == "p2plearn"
        unsupported = result.pop("unsupported")
        assert "p2plearn backend" in unsupported and "all_to_all_single" in unsupported, unsupported
        assert all(result.values()), (rank, result)


@pytest.mark.parametrize("scenario", ["ddp", "ddp_hook"])
def test_ddp_trains_as_over_gloo(tmp_path, scenario):
    for rank, result in enumerate(run_job(tmp_path, scenario, world_size=2)):
        assert result["start_equal"] and result["moved"], (rank, result)
        assert result["trained_equal"], (rank, result)
        if scenario == "ddp_hook":
            assert result["buckets"] > 1 and result["delivered"] == 1.0, result


def test_post_local_sgd_matches_gloo(tmp_path):
    for rank, result in enumerate(run_job(tmp_path, "post_local_sgd", world_size=2)):
        assert result["equal_to_gloo"], (rank, result)
    assert result["ranks_differ"]  # steps after the last average are local: the check is not vacuous


def test_distributed_checkpoint_saves_and_loads(tmp_path):
    assert all(result["restored"] for result in run_job(tmp_path, "checkpoint", world_size=2))
