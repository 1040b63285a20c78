"""The inbox's bounded store: deliveries kept by message id and sender until their round or collective takes them."""
from __future__ import annotations

from collections import Counter

from p2plearn.transport import Delivery

OVER_QUOTA = "over the quota of messages kept ahead"
SUPERSEDED = "superseded by its sender's newer message"


class KeptMessages:
    """Deliveries by message id, then sender, each sender's in arrival order.

    Beside the inbox's window of ids, it bounds what a peer can make this one hold: at most
    ``candidates`` deliveries per (message id, sender) and, with ``sender_bytes``, at most that
    many bytes of arrays per sender. What ``add`` cannot keep it names (a reason to count):

    - ``replace=True`` (training: one message per round and sender, its last word): a newcomer
      to a full (message id, sender) replaces the oldest there, which is dropped as SUPERSEDED.
    - ``replace=False`` (the collectives: candidates are checked in arrival order until one has
      this rank's shapes): the newcomer is refused as OVER_QUOTA, so a flood that comes after the
      real message cannot push it out.

    Not thread-safe: the inbox's owner (a synchronizer, a group's collective thread) calls it.
    """

    def __init__(self, candidates: int = 1, sender_bytes: int | None = None, replace: bool = True) -> None:
        if candidates < 1:
            raise ValueError(f"candidates must be at least 1, got {candidates}")
        self.candidates = candidates
        self.sender_bytes = sender_bytes
        self.replace = replace
        self._by_id: dict[int, dict[int, list[Delivery]]] = {}
        self._bytes: Counter[int] = Counter()  # per sender: the bytes of its kept deliveries (under a quota)
        self._count = 0

    def __len__(self) -> int:
        """Deliveries kept."""
        return self._count

    def ids(self) -> list[int]:
        """The message ids that have deliveries kept."""
        return list(self._by_id)

    def holds(self, msg_id: int, sender: int) -> bool:
        """Whether a delivery of ``msg_id`` from ``sender`` is kept."""
        return sender in self._by_id.get(msg_id, {})

    def add(self, d: Delivery) -> str | None:
        """Keep ``d``; returns why a delivery was not kept (``d``, or the one it superseded), else None."""
        by_sender = self._by_id.get(d.msg_id)
        kept = by_sender.get(d.sender) if by_sender is not None else None
        full = kept is not None and len(kept) >= self.candidates
        if full and not self.replace:
            return OVER_QUOTA
        superseded = kept[0] if full else None
        if self.sender_bytes is not None:  # (counted only under a quota: training's per-delivery cost stays low)
            size = _nbytes(d)
            if self._bytes[d.sender] + size - (_nbytes(superseded) if superseded is not None else 0) > self.sender_bytes:
                return OVER_QUOTA
            self._bytes[d.sender] += size
        if superseded is not None:
            if self.sender_bytes is not None:
                self._forget_bytes(superseded)
            kept.pop(0)
            self._count -= 1
        elif kept is None:
            kept = self._by_id.setdefault(d.msg_id, {}).setdefault(d.sender, [])
        kept.append(d)
        self._count += 1
        return SUPERSEDED if superseded is not None else None

    def pop(self, msg_id: int) -> dict[int, list[Delivery]]:
        """Remove and return the deliveries of ``msg_id``: sender -> its deliveries, in arrival order."""
        got = self._by_id.pop(msg_id, {})
        for kept in got.values():
            self._count -= len(kept)
            if self.sender_bytes is not None:
                for d in kept:
                    self._forget_bytes(d)
        return got

    def _forget_bytes(self, d: Delivery) -> None:
        self._bytes[d.sender] -= _nbytes(d)
        if not self._bytes[d.sender]:
            del self._bytes[d.sender]  # senders come and go: no entry stays for one that has nothing kept


def _nbytes(d: Delivery) -> int:
    return sum(a.nbytes for a in d.arrays) if d.arrays is not None else 0
