"""The one interface every update filter implements."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import numpy as np

from p2plearn.filter.wire import EncodedUpdate, decode
from p2plearn.stateful import Stateful


class UpdateFilter(Stateful, ABC):
    """Turns a round's per-layer updates into the message a peer sends (see `wire`).

    encode(round, updates) -> EncodedUpdate; decode(arrays, shapes, complete) -> dense updates;
    stats() -> totals over every message encoded so far.
    """

    name: str = ""
    STATE: tuple[str, ...] = ("_messages", "_dense_bytes", "_sent_bytes")

    def __init__(self) -> None:
        self._messages = 0
        self._dense_bytes = 0
        self._sent_bytes = 0

    @abstractmethod
    def encode(self, round: int, updates: Sequence[Any]) -> EncodedUpdate:
        """The message for this round's updates (numpy arrays or CPU tensors, one per layer)."""

    def decode(self, arrays: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]],
               complete: Sequence[bool] | None = None) -> list[np.ndarray]:
        """Dense updates from a received message; see `p2plearn.filter.wire.decode`."""
        return decode(arrays, shapes, complete)

    def stats(self) -> dict[str, float]:
        """messages, dense_bytes, sent_bytes and ratio = dense_bytes / sent_bytes (> 1: messages shrank)."""
        return {"messages": self._messages, "dense_bytes": self._dense_bytes, "sent_bytes": self._sent_bytes,
                "ratio": self._dense_bytes / self._sent_bytes if self._sent_bytes else 1.0}

    def _count(self, message: EncodedUpdate) -> EncodedUpdate:
        self._messages += 1
        self._dense_bytes += message.dense_bytes
        self._sent_bytes += message.sent_bytes
        return message

    @staticmethod
    def _flat(round: int, updates: Sequence[Any]) -> list[np.ndarray]:
        """Validated float32 flat views (values travel as float32)."""
        if not isinstance(round, (int, np.integer)) or round < 0:
            raise ValueError(f"round must be an integer >= 0, got {round!r}")
        if len(updates) == 0:
            raise ValueError("no updates: pass one array per layer")
        return [np.ascontiguousarray(u, dtype=np.float32).reshape(-1) for u in updates]
