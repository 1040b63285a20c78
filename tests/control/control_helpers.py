"""Helpers of the control-plane tests (a unique module name: every test folder is on sys.path)."""

import queue
import time

JOB = "test-job"


def wait_event(client, kind, timeout, rank=None):
    """The first event of ``kind`` (about ``rank``) within ``timeout`` seconds, else None."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            event = client.events.get(timeout=left)
        except queue.Empty:
            break
        if event.kind == kind and (rank is None or event.rank == rank):
            return event
    return None
