"""Loads the compiled SELMCAST planner and mask-aware merge (native/planner.c, native/merge.c; API in
native/compute.h) and turns their error codes into Python exceptions carrying the C message.

They are a module of their own, apart from the transport's engine, so that selection and sync reach
them without the transport: `p2plearn.selection.selmcast` plans with it, `p2plearn.sync.merge` merges
and decodes with it.
"""
from __future__ import annotations

import errno

from p2plearn._p2pcompute import ffi, lib  # built by `pip install` from native/ (cffi API mode)

__all__ = ["ffi", "lib", "ComputeError", "InvalidArgument", "check"]


class ComputeError(OSError):
    """A planner or merge call failed; the message is the C code's own, the errno its code."""


class InvalidArgument(ComputeError, ValueError):
    """The planner or the merge refused an argument (EINVAL)."""


def check(rc: int) -> int:
    """Raise ComputeError (InvalidArgument for EINVAL) for a negative return code, else pass it through."""
    if rc < 0:
        cls = InvalidArgument if -rc == errno.EINVAL else ComputeError
        raise cls(-rc, ffi.string(lib.p2p_last_error()).decode(errors="replace"))
    return rc
