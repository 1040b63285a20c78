"""The one interface every receiver-selection policy implements."""
from __future__ import annotations

from abc import ABC, abstractmethod

from p2plearn.selection.view import NetworkView


class SelectionPolicy(ABC):
    """Chooses, each round, which receivers each sender multicasts to.

    `plan(view, p, round)` returns {sender: [receivers]} for every live sender; a sender never
    receives from itself; dead peers neither send nor receive. Policies are deterministic given
    (view, p, round, seed) so that every peer computes the same plan locally.
    """

    name: str = ""

    def __init__(self, seed: int = 0):
        self.seed = seed

    @abstractmethod
    def plan(self, view: NetworkView, p: int, round: int) -> dict[int, list[int]]:
        ...
