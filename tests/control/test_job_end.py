"""The end of a job is no fault: no successor starts, and a successor whose job ended goes at once."""

import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from control_helpers import JOB, wait_event
from p2plearn.control import Client, ControlError, Coordinator
from p2plearn.control import protocol as p
from p2plearn.control.server import serve_while_needed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_coordinator_ended_with_its_job_starts_no_successor(key):
    """Rank 0 stops the coordinator it started while rank 1 is still registered (it finished
    first): rank 1 is told that the job ended, and neither looks for a successor (rank 1 once took
    the stop for a death and started one that outlived the job)."""
    coord = Coordinator(JOB, key, world_size=2, heartbeat=0.2).start()
    clients = [Client(coord.address, JOB, key, rank=r, successor_wait=1.0) for r in (0, 1)]
    try:
        for c in clients:
            c.register(("127.0.0.1", 9000 + c.rank))
        clients[0].leave()
        coord.end()
        assert wait_event(clients[1], "job_ended", timeout=5) is not None
        time.sleep(2.0)  # ten heartbeats: a client that took the silence for a death would fail over
        assert all(c._failover.spawned is None and c.coordinator_changes == 0 for c in clients)
        assert not clients[1].following
        clients[1].leave()  # nothing to tell: no error
        with pytest.raises(ControlError, match="job ended"):
            clients[1].fetch_view()
    finally:
        for c in clients:
            c.close()
        coord.stop()


def test_a_peer_still_starting_when_its_job_ended_knows_that_the_job_ran(key):
    """Rank 0 may end the job (and its coordinator) while a slow peer is still in its start-up wait,
    its subscription having missed the joins: ENDED says how many members the job had at once, so
    the peer's wait is over (it once failed its init with 'the job ended')."""
    coord = Coordinator(JOB, key, world_size=3, heartbeat=0.2).start()
    clients = [Client(coord.address, JOB, key, rank=r, connect_timeout=5.0) for r in range(3)]
    try:
        for c in clients:
            c.register(("127.0.0.1", 9000 + c.rank))
        clients[0].wait_members(3, timeout=5)
        late = clients[2]
        with late._cond:  # as if it had seen none of the joins
            late._replica._most_members = late._replica._most_planned = 0
        for c in clients[:2]:
            c.leave()
        coord.end()
        assert sorted(late.wait_members(3, timeout=5, receiving=True)) == [2]
        with pytest.raises(ControlError, match="job ended"):
            late.wait_members(4, timeout=5)  # a job that never had 4 members did not start
    finally:
        for c in clients:
            c.close()
        coord.stop()


def test_the_peer_that_stops_the_coordinator_can_wait_until_it_is_alone(connect):
    clients = [connect(r, ("127.0.0.1", 9000 + r)) for r in range(3)]
    clients[0].wait_members(3, timeout=5)
    clients[0].leave()
    assert not clients[0].wait_alone(0.3)  # ranks 1 and 2 are still members
    for c in clients[1:]:
        c.leave()
    assert clients[0].wait_alone(5)


def test_a_peer_that_left_still_learns_who_leaves_while_its_coordinator_looks_dead(connect):
    """On a busy host the coordinator's ticks come late and a peer that left suspects it: that peer
    follows no successor but goes on hearing the others leave (its listener once stopped, and rank 0
    waited its whole linger at the end of a job)."""
    clients = [connect(r, ("127.0.0.1", 9000 + r)) for r in range(3)]
    clients[0].wait_members(3, timeout=5)
    clients[0].leave()
    clients[0]._listener.detector.suspected = lambda now=None: True
    time.sleep(0.5)  # a few of its listener's checks
    for c in clients[1:]:
        c.leave()
    assert clients[0].wait_alone(5)
    assert clients[0]._failover.spawned is None and clients[0].coordinator_changes == 0


def test_a_client_that_left_starts_no_successor(key):
    """The coordinator vanishes (as a crash would) after rank 0 left: rank 0, which would host the
    successor, no longer takes part, so it starts none; rank 1, still in the job, does."""
    coord = Coordinator(JOB, key, world_size=2, heartbeat=0.2).start()
    clients = [Client(coord.address, JOB, key, rank=r, successor_wait=1.0) for r in (0, 1)]
    try:
        for c in clients:
            c.register(("127.0.0.1", 9000 + c.rank))
        clients[1].wait_members(2, timeout=5)
        clients[0].leave()
        deadline = time.monotonic() + 5
        while 0 in clients[1].members and time.monotonic() < deadline:
            time.sleep(0.02)
        coord.stop()
        assert wait_event(clients[1], "coordinator_moved", timeout=20) is not None
        assert clients[0]._failover.spawned is None and clients[0].coordinator_changes == 0
        assert clients[1]._failover.spawned is not None
    finally:
        for c in clients:
            c.close()
        coord.stop()
        for c in clients:
            if c._failover.spawned is not None:
                c._failover.spawned.stop()


def _serve_in_thread(coord, **limits):
    """serve_while_needed on a thread; returns (thread, stop event, when it returned [one value])."""
    stop, returned = threading.Event(), []

    def run():
        serve_while_needed(coord, stop, **limits)
        returned.append(time.monotonic())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, stop, returned


def test_a_successor_goes_once_every_registered_peer_left(key):
    """A successor presumes the members it is handed over; those never re-register (their job
    ended): once the peers that registered left, it goes at once, not after their grace (60 s at
    clock 0: a successor once outlived its job by 1.5 minutes)."""
    coord = Coordinator(JOB, key, world_size=3, heartbeat=0.2, term=1).start()
    thread, stop, returned = _serve_in_thread(coord, linger=0.5, startup_timeout=30.0)
    client = Client(coord.address, JOB, key, rank=0)
    try:
        resume = {"clock": 0, "epoch": 3, "view": None,
                  "members": [{"rank": r, "host": "h", "engine": ["127.0.0.1", 9000 + r]} for r in (0, 1, 2)]}
        client._requester.request(client._register_body(join=False, resume=resume))
        assert sorted(coord.members()) == [0, 1, 2] and coord.registered() == 1
        client._requester.request({"type": p.LEAVE, "rank": 0})
        left = time.monotonic()
        thread.join(timeout=10)
        assert returned, "the successor kept serving presumed members"
        print(f"successor done {returned[0] - left:.2f} s after the last registered peer left")
        assert sorted(coord.members()) == [1, 2]  # still presumed: they did not keep it
    finally:
        stop.set()
        client.close()
        coord.stop()


def test_a_successor_nobody_registers_at_goes_after_its_grace(key):
    coord = Coordinator(JOB, key, world_size=2, heartbeat=0.2, term=1).start()
    thread, stop, returned = _serve_in_thread(coord, linger=0.5, startup_timeout=0.5)
    try:
        thread.join(timeout=10)
        assert returned
    finally:
        stop.set()
        coord.stop()


PEER = "import sys, time, p2plearn\nrt = p2plearn.init(timeout=120)\n" \
       "if rt.rank != 0: time.sleep(float(sys.argv[1]))\nrt.close(linger=float(sys.argv[2]))\n"


def _coordinators_of(job_id: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", f"p2plearn.control --job-id {job_id}"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(subprocess.run(["which", "mpirun"], capture_output=True).returncode != 0,
                    reason="mpirun (Open MPI) is not installed")
def test_ten_mpirun_jobs_back_to_back_end_cleanly(tmp_path):
    """Ten ``mpirun -np 4`` jobs on one host, every rank ``init()`` then ``close()``: all finish,
    none fails over, and no coordinator process is left after any of them. In every other job
    rank 0 ends first (no linger) while the others are still registered, as a fast rank 0 does."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("P2PLEARN_")}
    base.update(PYTHONPATH=ROOT, MASTER_ADDR="127.0.0.1", XDG_RUNTIME_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    run_id = uuid.uuid4().hex[:8]
    for i in range(10):
        job_id = f"job-end-{run_id}-{i}"
        env = {**base, "P2PLEARN_JOB_ID": job_id, "MASTER_PORT": str(_free_port() - 1)}
        others_wait, linger = ("1.5", "0") if i % 2 else ("0", "10")
        argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", "-x", "PYTHONPATH", "-x", "MASTER_ADDR",
                "-x", "MASTER_PORT", "-x", "XDG_RUNTIME_DIR", "-x", "P2PLEARN_JOB_ID", "-x", "OMP_NUM_THREADS",
                sys.executable, "-c", PEER, others_wait, linger]
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=180)
            left = _coordinators_of(job_id)
            print(f"job {i}: rc {proc.returncode}, coordinators left {left}")
            assert proc.returncode == 0, out
            assert "following the coordinator" not in out, out  # nobody failed over
            assert left == [], out
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
            for pid in _coordinators_of(job_id):
                os.kill(pid, 9)
