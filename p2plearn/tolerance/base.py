"""The one interface every loss-tolerance policy implements, and the state it decides from."""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from p2plearn.stateful import Stateful


@dataclass(frozen=True)
class Layer:
    """One tensor of the model, as a message segment."""

    name: str
    numel: int
    nbytes: int
    depth: int              # position in the model, 0 = input side
    kind: str = "weight"    # "weight", "bias" or "norm" (normalisation parameters)


HISTORY = 50  # rounds (and training reports) a policy's states keep, newest last
CUT_RESULTS = ("deadline", "slow")  # send results of a flow cut short: by its deadline, or a slow close


@dataclass
class RoundRecord:
    """What one finished round measured on the network (from the engine's per-receiver stats)."""

    round: int
    elapsed_s: float                  # wall time of the round's communication
    delivered: float                  # mean fraction delivered to receivers
    loss_rate: float                  # mean measured datagram loss
    delivery_rates: list[float] = field(default_factory=list)  # bytes/s per receiver
    deadline_hit: bool = False        # a flow was cut short (CUT_RESULTS)
    message_bytes: int = 0            # bytes of the message per receiver that round; 0 = unknown

    @classmethod
    def of_sends(cls, round: int, elapsed_s: float, sent: Sequence[Any], message_bytes: int) -> RoundRecord:
        """The record of a round whose sends ended with ``sent`` (the engine's per-receiver stats:
        `p2plearn.transport.ReceiverStats`); none sent: everything delivered."""
        return cls(round=round, elapsed_s=elapsed_s,
                   delivered=sum(st.delivered for st in sent) / len(sent) if sent else 1.0,
                   loss_rate=sum(st.loss_rate for st in sent) / len(sent) if sent else 0.0,
                   delivery_rates=[st.delivery_rate for st in sent],
                   deadline_hit=any(st.result in CUT_RESULTS for st in sent), message_bytes=message_bytes)


@dataclass
class NetworkState:
    """The recent history of rounds, newest last; policies read what they need."""

    history: list[RoundRecord] = field(default_factory=list)
    expected_bytes: int = 0           # bytes this peer sends per receiver this round
    planned_time_s: float = 0.0       # T(plan) from selection, when known

    def record(self, record: RoundRecord) -> None:
        """A finished round's record (the newest HISTORY kept)."""
        self.history.append(record)
        del self.history[:-HISTORY]


@dataclass
class TrainingState:
    """What training has measured: newest last; evaluation accuracy when the script reports it."""

    losses: list[float] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)   # per evaluation (e.g. per epoch)
    update_norms: list[float] = field(default_factory=list)  # whole-model update norm per round
    layer_update_norms: list[list[float]] = field(default_factory=list)  # per round, per layer
    losses_reported: int = 0   # losses reported since the start (`losses` may keep only the newest)

    def record_update(self, layer_norms: Sequence[float]) -> None:
        """A round's update norm of each layer (and so of the model); the newest HISTORY kept."""
        self.layer_update_norms.append([float(n) for n in layer_norms])
        self.update_norms.append(math.sqrt(sum(n * n for n in self.layer_update_norms[-1])))
        del self.layer_update_norms[:-HISTORY], self.update_norms[:-HISTORY]

    def record_loss(self, loss: float) -> None:
        """A training loss (a step's or a round's); the newest HISTORY kept."""
        self.losses.append(float(loss))
        self.losses_reported += 1
        del self.losses[:-HISTORY]


def check_bound(name: str, value: float) -> None:
    """Raise unless `value` is a valid loss bound: a fraction in [0, 1) (1 would allow sending nothing)."""
    if not 0 <= value < 1:
        raise ValueError(f"{name} must be in [0, 1), got {value}")


class TolerancePolicy(Stateful, ABC):
    """Decides, each round, the loss bound of each layer and the round's transfer deadline.

    bounds(...) -> (per-layer bounds in [0, 1), deadline in seconds or None for none).
    reads_update_norms: whether `bounds` reads the training state's update norms; the callers
    measure them (a pass over the whole model per round) only for a policy that does.
    """

    name: str = ""
    reads_update_norms: bool = False

    @abstractmethod
    def bounds(self, round: int, layers: list[Layer], network: NetworkState,
               training: TrainingState) -> tuple[list[float], float | None]:
        ...
