"""The phi-accrual failure detector: suspicion from the observed rhythm, grace at start-up."""

import random

from p2plearn.control.detector import PhiAccrualDetector


def beats(detector, start, interval, count, jitter=0.0, rng=None):
    t = start
    for _ in range(count):
        t += interval + (rng.uniform(-jitter, jitter) if rng else 0.0)
        detector.heartbeat(t)
    return t


def test_a_regular_heartbeat_is_suspected_soon_after_it_stops():
    d = PhiAccrualDetector(0.5, now=0.0)
    last = beats(d, 0.0, 0.5, 20)
    assert not d.suspected(last + 0.9)          # a late heartbeat is not a death
    assert d.suspected(last + 1.5)               # the documented ~1.4 s on a quiet machine
    assert 1.2 < d.timeout() < 1.5
    assert d.phi(last + 0.1) < 1.0 < d.phi(last + 1.0)


def test_an_irregular_heartbeat_is_given_more_time():
    rng = random.Random(1)
    quiet, busy = PhiAccrualDetector(0.5, now=0.0), PhiAccrualDetector(0.5, now=0.0)
    beats(quiet, 0.0, 0.5, 50)
    beats(busy, 0.0, 0.5, 50, jitter=0.4, rng=rng)
    assert busy.timeout() > quiet.timeout() + 0.5


def test_start_up_grace_then_rhythm():
    d = PhiAccrualDetector(0.5, grace=10.0, warmup=5, now=0.0)
    d.heartbeat(0.5)
    assert not d.suspected(8.0)                  # a peer importing torch for seconds is not dead
    assert d.suspected(11.0)
    d.end_warmup()                               # it reported a round: the rhythm rules now
    assert d.suspected(2.5)


def test_a_suspected_process_is_trusted_again_after_a_heartbeat():
    d = PhiAccrualDetector(0.5, now=0.0)
    last = beats(d, 0.0, 0.5, 10)
    assert d.suspected(last + 5.0)
    d.heartbeat(last + 5.0)
    assert not d.suspected(last + 5.2)


def test_memory_is_a_window():
    d = PhiAccrualDetector(0.5, window=10, now=0.0)
    t = beats(d, 0.0, 3.0, 10)                   # a slow past...
    t = beats(d, t, 0.5, 10)                     # ...forgotten once the window has moved on
    assert d.timeout() < 1.5


def test_without_warmup_count_only_end_warmup_ends_the_grace():
    d = PhiAccrualDetector(0.5, grace=10.0, warmup=None, now=0.0)
    last = beats(d, 0.0, 0.5, 50)                # a starting peer's heartbeats, in rhythm...
    assert not d.suspected(last + 5.0)           # ...then a 5 s import: still in its grace
    d.end_warmup()
    assert d.suspected(last + 5.0)
