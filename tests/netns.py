"""`inside(namespace)`: run a block in a network namespace, this thread only (tests that make an
engine there: the engine keeps the socket it made, and only its own I/O thread uses it)."""
from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


@contextlib.contextmanager
def inside(namespace: str) -> Iterator[None]:
    """The calling thread in `ip netns` namespace ``namespace`` for the block, back in its own after."""
    own, there = os.open("/proc/thread-self/ns/net", os.O_RDONLY), os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        _setns(there)
        yield
    finally:
        _setns(own)
        os.close(own)
        os.close(there)
