"""Loads the compiled engine and turns its error codes into Python exceptions carrying the C message."""
from __future__ import annotations

import errno

from p2plearn._p2pcast import ffi, lib  # built by `pip install` from native/ (cffi API mode)

__all__ = ["ffi", "lib", "TransportError", "InvalidArgument", "check"]


class TransportError(OSError):
    """An engine call failed; the message is the engine's own, the errno its code."""


class InvalidArgument(TransportError, ValueError):
    """The engine refused an argument (EINVAL)."""


def check(rc: int) -> int:
    """Raise TransportError (InvalidArgument for EINVAL) for a negative return code, else pass it through."""
    if rc < 0:
        cls = InvalidArgument if -rc == errno.EINVAL else TransportError
        raise cls(-rc, ffi.string(lib.p2p_last_error()).decode(errors="replace"))
    return rc
