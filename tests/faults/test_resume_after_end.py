"""A rank stopped (SIGSTOP) until the others finished, then continued, ends the same way in BSP and
SSP and under any start: it learns at once that the job ended, writes one line and exits with code
1 (docs/failure-model.md). Real processes; the outputs are in each assertion's message. The last
test drives the state transfer in one process."""

import os
import signal
import threading
import time

import pytest
import torch

from faults_helpers import coordinators_of
from p2plearn.train.optimizer import JobEnded
from tests.train.conftest import in_process_job

STEPS = 60
ENDED = "the job ended before this peer finished"
PROMPT_S = 15.0  # the continued rank's end: its round in flight, then the job's end (not a 60 s wait)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sync", ["bsp", "ssp"])
def test_a_rank_continued_after_its_job_ended_stops_with_one_line(job, sync):
    """No launcher: rank 0 stops the coordinator it started as it exits, which tells the stopped rank
    that the job ended. Continued, that rank once took the silence for a death before it read that,
    started a coordinator of its own and trained alone (exit 0), or waited 60 s for a donor (exit 1)."""
    j = job(4, steps=STEPS, average=True, env={"P2PLEARN_SYNC": sync})
    j.wait_ready()
    time.sleep(1.0)  # rounds together first
    victim = j.procs[2]
    os.kill(victim.pid, signal.SIGSTOP)
    assert [j.procs[r].wait(timeout=120) for r in (0, 1, 3)] == [0, 0, 0], j.output()
    before = len(j.lines[2])
    os.kill(victim.pid, signal.SIGCONT)
    continued = time.monotonic()
    j.wait_line(2, ENDED, timeout=90)
    took = time.monotonic() - continued
    assert j.wait(timeout=10)[2] == 1, j.output()
    assert len(j.lines[2]) == before + 1, j.output()  # that line alone
    assert took < PROMPT_S, j.output()
    assert coordinators_of(j.job_id) == []  # it started none
    print(f"{sync}: rank 2 stopped {took:.1f} s after it was continued")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sync", ["bsp", "ssp"])
def test_under_p2plearn_run_a_rank_continued_as_its_job_ends_stops_with_one_line(launched, sync):
    """p2plearn-run's coordinator serves 10 s past the last member: the continued rank is readmitted
    with no peer left to take the model from. It once trained alone to its end (exit 0)."""
    j = launched(4, steps=STEPS, sync=sync)
    j.wait_ready()
    time.sleep(1.0)
    os.kill(j.pids[2], signal.SIGSTOP)
    for rank in (0, 1, 3):
        j.wait_line(rank, f"p2plearn rank {rank}: ", timeout=120)  # its summary, as it exits
    before = len(j.lines[2])
    os.kill(j.pids[2], signal.SIGCONT)
    continued = time.monotonic()
    j.wait_line(2, ENDED, timeout=90)
    took = time.monotonic() - continued
    assert j.wait(timeout=30) == 1, j.output()
    assert len(j.lines[2]) == before + 1, j.output()  # that line alone
    assert any("rank 2" in line and "exit code 1" in line and ENDED in line for line in j.launcher_lines), j.output()
    assert took < PROMPT_S, j.output()
    print(f"{sync}: rank 2 stopped {took:.1f} s after it was continued")


def test_a_joiner_whose_donor_leaves_before_sending_the_state_stops_at_once():
    """The donor finished and left without sending the state: no peer is left to send one. The
    joiner once kept asking the coordinator for that donor and failed only after 60 s."""
    with in_process_job(1) as (runtime, optimizer):
        first = runtime(0)
        opt = optimizer(first, torch.nn.Linear(4, 2))
        for _ in range(3):
            opt.step()  # rounds made: a joiner needs the state
        joiner = runtime(None, join=True)
        assert joiner.client.donor.rank == 0  # asked to donate, it steps no more: it never sends
        leave = threading.Timer(1.0, first.client.leave)
        leave.start()
        try:
            t0 = time.monotonic()
            with pytest.raises(JobEnded, match=ENDED) as ended:
                optimizer(joiner, torch.nn.Linear(4, 2))
            assert time.monotonic() - t0 < 9.0  # the donor left 1 s in; the next ask was due at 10 s
            assert ended.value.code.count("\n") == 0  # one line
        finally:
            leave.join()
