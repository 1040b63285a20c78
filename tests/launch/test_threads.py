"""Threads: p2plearn.init() says when a host's ranks run more torch threads than it has cores and the
user chose them (it shares the cores out itself otherwise: tests/launch/test_one_line_errors.py)."""

import logging
import os

import pytest

from p2plearn import runtime
from p2plearn.runtime import oversubscription


def test_oversubscription_says_how_many_threads_fit():
    assert oversubscription(threads=2, local_ranks=4, cores=8) is None
    assert oversubscription(threads=1, local_ranks=8, cores=2) is None  # ranks outnumber cores: threads cannot help
    warning = oversubscription(threads=8, local_ranks=4, cores=8)
    assert warning == ("p2plearn: 4 ranks on this host run 8 torch threads each on 8 cores: set OMP_NUM_THREADS=2 "
                       "for every rank (p2plearn-run does), or torch.set_num_threads(2)")


@pytest.mark.slow
def test_init_warns_once_on_local_rank_0_when_torch_threads_oversubscribe(caplog):
    torch = pytest.importorskip("torch")
    cores = len(os.sched_getaffinity(0))
    # A job of one peer that says its host runs `cores` ranks: 2 threads each cannot fit. The user chose
    # them (OMP_NUM_THREADS): init() leaves them, and warns.
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(cores), "OMP_NUM_THREADS": "2"}
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with caplog.at_level(logging.WARNING, logger="p2plearn"):
            runtime.init(environ=env, timeout=30.0).close(linger=0)
            runtime.init(environ={**env, "LOCAL_RANK": "1"}, timeout=30.0).close(linger=0)  # not again
    finally:
        torch.set_num_threads(before)
    warned = [r.getMessage() for r in caplog.records if "torch threads" in r.getMessage()]
    assert warned == [f"p2plearn: {cores} ranks on this host run 2 torch threads each on {cores} cores: set "
                      f"OMP_NUM_THREADS=1 for every rank (p2plearn-run does), or torch.set_num_threads(1)"]
