"""Watchers: more than one monitor on one coordinator (its page and its ``--log-dir`` plan log).

``Coordinator.watcher`` is one object, called on the serving thread with the lock held; this one
passes each call on to every watcher added, in order (``watch``).
"""

from __future__ import annotations

from typing import Any


class Watchers:
    """A fan-out of ``observe``, ``published`` and ``reported`` calls."""

    def __init__(self, *watchers: Any) -> None:
        self.watchers = list(watchers)

    def observe(self, snapshot: dict[str, Any]) -> None:
        for watcher in self.watchers:
            watcher.observe(snapshot)

    def published(self, publication: Any) -> None:
        for watcher in self.watchers:
            watcher.published(publication)

    def reported(self, *report: Any) -> None:
        for watcher in self.watchers:
            watcher.reported(*report)


def watch(coordinator: Any, watcher: Any) -> None:
    """Add ``watcher`` to ``coordinator``'s (before its ``start()``)."""
    current = coordinator.watcher
    if current is None:
        coordinator.watcher = watcher
    elif isinstance(current, Watchers):
        current.watchers.append(watcher)
    else:
        coordinator.watcher = Watchers(current, watcher)
