"""The data channel and the control-plane client, as the code that is handed one uses them.

A `Synchronizer` (and the optimizer that builds one) gets its channel and its client from outside:
the engine's `Channel` or the TCP baseline's `TcpChannel`, a real `Client` or a test's fake. These
protocols say what such code may rely on, so that it is typed without naming (or importing) one
implementation. They declare only what that code uses; an implementation may do more (a
`Channel` also fills bubbles and probes multicast reach).

Nothing here is imported at run time but `typing`: the transport and control layers import this
module's users, not the other way round.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from p2plearn.control.membership import Event, Member
    from p2plearn.control.view import GlobalView
    from p2plearn.transport.channel import ReceiverStats
    from p2plearn.transport.delivery import Delivery


@runtime_checkable
class PendingSend(Protocol):
    """A send in flight, as `DataChannel.send` returns it.

    Implemented by `p2plearn.transport.SendHandle` (the engine's) and `TcpSendHandle`; a round
    waits on it for the per-receiver stats it reports to the control plane.
    """

    def wait(self, timeout: float | None = None) -> list[ReceiverStats]:
        """Block until every receiver finished; one `ReceiverStats` per receiver, in send order.
        TimeoutError if `timeout` seconds pass first."""
        ...


@runtime_checkable
class DeliverySource(Protocol):
    """Where received messages come from: all an `Inbox` needs of a channel.

    Every `DataChannel` is one; it exists apart so that the inbox's tests can feed it a plain
    list of deliveries instead of a channel.
    """

    def recv(self, timeout: float | None = None) -> Delivery | None:
        """The next delivered message, or None if none came within `timeout` seconds."""
        ...


@runtime_checkable
class DataChannel(DeliverySource, Protocol):
    """One peer's data plane, as a synchronizer and the optimizer use the channel they are given.

    Implemented by `p2plearn.transport.Channel` (the native loss-tolerant engine) and
    `p2plearn.transport.TcpChannel` (the reliable TCP baseline, which takes and ignores receiver
    rates, loss bounds and ``multicast``); tests may pass fakes. It exists so that code handed a
    channel says which one of those it works with (both, and any fake with these members) instead
    of taking ``Any``. `Channel.probe_multicast` is not part of it: only the engine has it, and
    only the code that built its own engine calls it.
    """

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) where this channel receives: what the peer registers with the coordinator."""
        ...

    def send(self, msg_id: int, arrays: Sequence[Any], receivers: Iterable[tuple[str, int] | tuple[str, int, float]],
             loss_bounds: float | Sequence[float] = 0.0, deadline: float | None = None, *,
             multicast: bool | Sequence[bool] | None = None, slow_close: float = 0.0) -> PendingSend:
        """Start sending `arrays` (numpy arrays or CPU tensors, read in place until the send is
        done) as message `msg_id` to every receiver ((host, port[, pacing rate in bytes/s]));
        returns at once. `loss_bounds`: per array (or one for all), the fraction a receiver may
        miss; `deadline`: seconds after which each receiver's send closes; `multicast`: per
        receiver (or for all) whether it goes through the sender's group; `slow_close`: S, a
        paced receiver's send closes once its arrivals put its end past S x its planned time
        (0 = off; a transport without pacing ignores it)."""
        ...

    def stats(self) -> Mapping[str, int]:
        """Counters since the channel opened: ``bytes_sent`` and ``bytes_received`` always, the
        engine's ``receiving_bytes`` / ``receiving_messages`` and others where it has them."""
        ...

    def close(self) -> None:
        """Stop the channel (its owner does, once); sends in flight end."""
        ...


@runtime_checkable
class ControlClient(Protocol):
    """This peer's control-plane client, as the code that is handed one uses it: the
    synchronizers (membership, views, reports, the SSP clock), the optimizer (start-up, joining,
    donations, multicast reach) and `p2plearn.runtime.Runtime` (registration and leaving).

    Implemented by `p2plearn.control.Client`; the signatures are its own. It exists so that this
    code is typed without ``Any`` and tests can pass a fake client (one with these members) to a
    synchronizer instead of starting a coordinator.
    """

    # -- what is known: pushed by the coordinator, or learned at registration --

    @property
    def address(self) -> str:
        """The endpoint of the coordinator followed now."""
        ...

    @property
    def rank(self) -> int | None:
        """This peer's rank (None until a joining peer is registered)."""
        ...

    @property
    def members(self) -> dict[int, Member]:
        """The live members by rank, as last pushed (a copy)."""
        ...

    @property
    def view(self) -> GlobalView | None:
        """The newest GlobalView held (None before the first)."""
        ...

    def view_for(self, round: int) -> GlobalView | None:
        """The view that plans `round` (every peer holding the same views picks the same one)."""
        ...

    @property
    def following(self) -> bool:
        """False while the client is looking for a (new) coordinator."""
        ...

    @property
    def donor(self) -> Member | None:
        """For a joining (or readmitted) peer, the live peer that sends it the model state."""
        ...

    @property
    def start_clock(self) -> int:
        """The clock this peer takes part from (0, or the running job's for a joiner)."""
        ...

    @property
    def coordinator_changes(self) -> int:
        """How many times the client moved to another coordinator."""
        ...

    # -- requests and reports --

    def register(self, engine: tuple[str, int] | None = None, *, join: bool = False) -> dict[int, Member]:
        """Join the membership with this peer's data-engine address (again: update it); the members."""
        ...

    def ask_for_state(self) -> Member | None:
        """Ask for a donor again (the last one's state did not come); the new donor."""
        ...

    def report(self, clock: int, *, loss: float | None = None, step_time: float | None = None,
               links: Mapping[int, Mapping[str, float]] | None = None, load: Mapping[str, float] | None = None,
               message_bytes: int | None = None, counts: Mapping[str, int] | None = None) -> None:
        """Report a finished round (one-way, never waits)."""
        ...

    def report_reach(self, reached: Iterable[int]) -> None:
        """Tell the coordinator which ranks this peer's multicast probe reached."""
        ...

    @property
    def clock_current(self) -> bool:
        """Whether the slowest live clock is the coordinator's current one (it was heard lately)."""
        ...

    def wait_min_clock(self, target: int, timeout: float) -> bool:
        """Wait until the slowest live clock reaches `target`; False on timeout."""
        ...

    def wait_members(self, count: int, timeout: float, *, receiving: bool = False) -> dict[int, Member]:
        """Wait until `count` peers are (or once were) live members at once; the members now."""
        ...

    def on_event(self, callback: Callable[[Event], None]) -> None:
        """Call `callback(event)` on the client's thread for each event."""
        ...

    def leave(self, timeout: float | None = None) -> None:
        """Deregister cleanly; ``timeout``: how long to wait for the reply (None: the client's own)."""
        ...

    def wait_alone(self, timeout: float) -> bool:
        """Wait until no other peer is a member, or the job ended; True if so."""
        ...

    def wait_left(self, ranks: Iterable[int], timeout: float) -> bool:
        """Wait until none of `ranks` is a member, or the job ended; True if so."""
        ...

    def close(self) -> None:
        """Stop heartbeats and release the sockets (does not deregister)."""
        ...
