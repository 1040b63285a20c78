"""Fixtures of the fault tests: a job that is always cleaned up."""

import os

import pytest

from faults_helpers import Job


@pytest.fixture
def job(tmp_path):
    """job(n, seconds=..., step_time=..., env=...) -> a started Job; killed after the test, also on failure."""
    jobs = []

    def start(n, **kwargs):
        j = Job(n, str(tmp_path), **kwargs)
        jobs.append(j)
        return j

    yield start
    for j in jobs:
        j.close()


@pytest.fixture
def busy_cores():
    """A CPU hog on every core for the test's duration (stopped after it, also on failure)."""
    from p2plearn.bench.startup import cpu_hog

    with cpu_hog(os.cpu_count() or 2):
        yield
