"""Fixtures of the fault tests: a job that is always cleaned up."""

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
