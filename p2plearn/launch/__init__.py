"""The ``p2plearn-run`` launcher (see ``p2plearn.launch.cli`` for its manual)."""

from .run import main

__all__ = ["main"]
