"""Datagrams are good in one job only: the data key is derived from the secret and the full job id,
and the wire's job field is a hash of the full job id, so two jobs sharing one secret (Slurm jobs
1234567 and 1234599 under one ``P2PLEARN_JOB_KEY``) refuse each other's datagrams."""
from __future__ import annotations

import time

import numpy as np

from p2plearn.keys import data_key, job_tag
from tests.transport.craft import ACK, datagram

SECRET = "ab" * 32
JOBS = ("1234567", "1234599")  # the same first 4 bytes


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_keys_and_job_tags_differ_for_job_ids_with_a_common_prefix():
    assert data_key(SECRET, JOBS[0]) != data_key(SECRET, JOBS[1])
    assert job_tag(JOBS[0]) != job_tag(JOBS[1])
    assert data_key(SECRET, JOBS[0]) == data_key(bytes.fromhex(SECRET), JOBS[0])


def test_two_jobs_sharing_a_secret_refuse_each_others_datagrams(channels, raw_peer):
    one, two = (channels(sender_id=1, job_id=job, key=data_key(SECRET, job)) for job in JOBS)
    x = np.arange(5000, dtype=np.float32)
    for src, dst in ((one, two), (two, one)):
        src.send(1, [x], [dst.address], deadline=0.3)
        wait_for(lambda: dst.stats()["drop_other_job"] > 0)
        assert dst.recv(timeout=0.5) is None
    # The job field is no secret: a datagram that copies another job's is still refused, by its key.
    forged = datagram(ACK, body=bytes(24), job=JOBS[1], key=data_key(SECRET, JOBS[0]), to=two.address)
    raw_peer.send(forged, two.address)
    wait_for(lambda: two.stats()["drop_bad_tag"] == 1)
    # while a member of the job is heard
    mate = channels(sender_id=2, job_id=JOBS[1], key=data_key(SECRET, JOBS[1]))
    mate.send(2, [x], [two.address])
    got = two.recv(timeout=10)
    assert got is not None and (got.sender, got.msg_id) == (2, 2)
    np.testing.assert_array_equal(got.arrays[0], x)


def test_the_previous_wire_version_is_refused_and_counted(channels, raw_peer):
    key = data_key(SECRET, JOBS[0])
    b = channels(job_id=JOBS[0], key=key)
    for version in (2, 4):
        raw_peer.send(datagram(ACK, body=bytes(24), job=JOBS[0], key=key, to=b.address, version=version), b.address)
    raw_peer.send(datagram(ACK, body=bytes(24), job=JOBS[0], key=key, to=b.address), b.address)  # this version's
    wait_for(lambda: b.stats()["datagrams_received"] == 3)
    st = b.stats()
    assert (st["drop_bad_version"], st["drop_unknown"]) == (2, 1), st
