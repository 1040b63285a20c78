"""The end of a job after a fault, with both cores busy: every peer that lives trains all its steps,
the final average (``average_model``) is made from the live peers, and the exit codes say so.
Real processes, started without a launcher; the peers' outputs are in each assertion's message."""

import os
import signal
import time

import pytest

pytestmark = pytest.mark.slow

STEPS = 150


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sync", ["bsp", "ssp"])
def test_a_peer_paused_for_10s_rejoins_and_the_job_ends_with_every_model_averaged(job, busy_cores, sync):
    """Rank 2 is paused for 10 s and readmitted: it finishes its steps after the others, who wait
    for its model in the final average without holding it back (its clock runs ahead of theirs)."""
    j = job(4, steps=STEPS, step_time=0.1, average=True, env={"P2PLEARN_SYNC": sync})
    j.wait_ready()
    time.sleep(2.0)
    victim = j.ready[2][0]
    os.kill(victim, signal.SIGSTOP)
    time.sleep(10.0)
    os.kill(victim, signal.SIGCONT)
    resumed = time.time()
    assert j.wait(timeout=400) == [0, 0, 0, 0], j.output()
    results = [j.result(rank) for rank in range(4)]
    assert all(r["steps"] == STEPS and r["finite"] for r in results), j.output()
    assert results[2]["rejoins"] == 1, j.output()
    assert results[0]["times"][-1] > resumed, "the others finished during the pause: the case is not tested"
    assert results[0]["averaged_from"] == [0, 1, 2, 3], j.output()
    assert all(r["averaged_from"] is None for r in results[1:]), j.output()
    late = results[2]["times"][-1] - max(r["times"][-1] for r in results if r is not results[2])
    print(f"{sync}: rank 2 finished {late:.1f} s after the others; the root's final average took "
          f"{results[0]['average_s']:.1f} s, the others' {max(r['average_s'] for r in results[1:]):.2f} s at most")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sync", ["bsp", "ssp"])
def test_rank0_killed_under_mpirun_the_others_train_to_the_end_and_average_without_it(job, busy_cores, sync):
    """Open MPI's variables, no launcher: rank 0 started the coordinator's process, which outlives
    it; the survivors train every step, and the next live rank (1) makes the final average."""
    j = job(4, steps=STEPS, average=True, launcher="mpirun", env={"P2PLEARN_SYNC": sync})
    j.wait_ready()
    time.sleep(2.0)
    os.kill(j.ready[0][0], signal.SIGKILL)
    killed = time.time()
    codes = j.wait(timeout=400)
    assert codes == [-signal.SIGKILL, 0, 0, 0], j.output()
    results = [j.result(rank) for rank in (1, 2, 3)]
    assert all(r["steps"] == STEPS and r["finite"] for r in results), j.output()
    assert results[0]["times"][-1] > killed, "training ended before the kill: the case is not tested"
    assert results[0]["averaged_from"] == [1, 2, 3], j.output()
    assert all(r["averaged_from"] is None for r in results[1:]), j.output()
    print(f"{sync}: the final average took {results[0]['average_s']:.2f} s at rank 1 (the root), "
          f"{max(r['average_s'] for r in results[1:]):.2f} s at most at the others")


@pytest.mark.timeout(300)
def test_the_final_averages_root_answers_a_sender_until_it_left(job):
    """Rank 1 sends its final model again 1.5 s after the root acknowledged it, as a sender whose
    acknowledgements were lost on a lossy link does: the root's engine still answers (closed once
    the models were in, its silence made rank 1 give the root up and average alone, a second root),
    and the root returns once rank 1 left."""
    j = job(2, steps=20, average=True, flags=("--ask-root-again", "1.5"))
    assert j.wait(timeout=120) == [0, 0], j.output()
    root, sender = j.result(0), j.result(1)
    assert sender["asked_again"] == [True], j.output()
    assert root["averaged_from"] == [0, 1], j.output()
    assert sender["averaged_from"] is None, j.output()
    assert root["average_s"] >= 1.5, root["average_s"]  # it waited for rank 1 to leave
