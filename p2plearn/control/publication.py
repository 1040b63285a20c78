"""What the membership table hands the coordinator to broadcast to every client."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Publication:
    """One broadcast to every client: ``{"type": kind, **body}``, with ``blobs`` (a view's arrays)."""

    kind: str
    body: dict[str, Any]
    blobs: list[bytes] | None = None
