"""The p2plearn torch.distributed backend, multi-process, against gloo in the same job: on the CPU,
on the CPU through the device path (``P2PLEARN_STAGING=host``: host copies of every tensor), and
on a GPU where CUDA is (skipped elsewhere)."""
import re

import pytest
import torch

from tests.distributed.job import run_job

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
        # torch names the op all_to_all_single for CPU tensors and alltoall_base for CUDA ones
        assert re.fullmatch(r"the p2plearn backend does not implement (all_to_all_single|alltoall_base)",
                            unsupported), unsupported
        assert all(result.values()), (rank, result)


@pytest.mark.parametrize("env", DEVICES)
@pytest.mark.parametrize("scenario", ["ddp", "ddp_hook", "ddp_hadamard"])
def test_ddp_trains_as_over_gloo(tmp_path, scenario, env):
    for rank, result in enumerate(run_job(tmp_path, scenario, world_size=2, env=env)):
        assert result["start_equal"] and result["moved"], (rank, result)
        assert result["trained_equal"], (rank, result)
        if scenario != "ddp":
            assert result["buckets"] > 1 and result["delivered"] == 1.0, result


def test_post_local_sgd_matches_gloo(tmp_path):
    for rank, result in enumerate(run_job(tmp_path, "post_local_sgd", world_size=2)):
        assert result["equal_to_gloo"], (rank, result)
    assert result["ranks_differ"]  # steps after the last average are local: the check is not vacuous


def test_distributed_checkpoint_saves_and_loads(tmp_path):
    assert all(result["restored"] for result in run_job(tmp_path, "checkpoint", world_size=2))
