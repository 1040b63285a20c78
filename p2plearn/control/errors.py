"""What a control client raises. Every error is a ``ControlError``: a caller that only needs to
know that the control plane did not answer catches that one."""

from __future__ import annotations


class ControlError(RuntimeError):
    """The coordinator refused a request or could not be reached in time."""


class Refused(ControlError):
    """The coordinator refused this peer (wrong job id or key, or a rank already taken)."""


class SelfConnected(ControlError):
    """A request came back as its own reply: nothing listened on the coordinator's port yet and the
    connect, from a source port equal to it, reached this socket itself (TCP simultaneous open)."""


class CoordinatorDead(ControlError):
    """No coordinator, not even a successor, answered for the client's ``give_up`` seconds."""
