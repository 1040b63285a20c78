"""Fixtures of the fault tests: a job that is always cleaned up."""

import os

import pytest

from faults_helpers import Job, LaunchedJob


@pytest.fixture
def job(tmp_path):
    """job(n, seconds=..., step_time=..., env=...) -> a started Job; killed after the test, also on failure."""
    yield from _started(Job, str(tmp_path))


@pytest.fixture
def launched(tmp_path):
    """launched(n, steps=..., sync=...) -> a started p2plearn-run job (LaunchedJob); killed after the
    test, also on failure."""
    yield from _started(LaunchedJob, str(tmp_path))


def _started(kind, out):
    jobs = []

    def start(n, **kwargs):
        j = kind(n, out, **kwargs)
        jobs.append(j)
        return j

    try:
        yield start
    finally:
        for j in jobs:
            j.close()


@pytest.fixture
def busy_cores():
    """A CPU hog on every core for the test's duration (stopped after it, also on failure)."""
    from p2plearn.bench.startup import cpu_hog

    with cpu_hog(os.cpu_count() or 2):
        yield
