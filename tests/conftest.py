"""Tests marked ``root`` build network namespaces (testbed, simulator validation, experiments): skipped,
with the reason, without root or without ip/tc/iptables."""
import pytest

from p2plearn.testbed import TestbedError
from p2plearn.testbed.system import check_can_build


def _why_not_buildable():
    try:
        check_can_build()
    except TestbedError as error:
        return f"testbed needs root and system tools: {error}"
    return None


def pytest_collection_modifyitems(items):
    reason = _why_not_buildable()
    if reason:
        for item in items:
            if item.get_closest_marker("root"):
                item.add_marker(pytest.mark.skip(reason=reason))
