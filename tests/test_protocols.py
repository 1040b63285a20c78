"""The protocols of `p2plearn.protocols` hold of what implements them: the engine's Channel and the
TcpChannel are DataChannels (and their send handles PendingSends), and the control-plane Client is a
ControlClient with the very signatures the protocol declares."""
from __future__ import annotations

import inspect
import secrets
from typing import Generic, Protocol

import numpy as np
import pytest

from p2plearn.control import Client, Coordinator
from p2plearn.protocols import ControlClient, DataChannel, DeliverySource, PendingSend
from p2plearn.transport import Channel, TcpChannel

PROTOCOLS = (PendingSend, DeliverySource, DataChannel, ControlClient)


def declared(proto: type) -> dict[str, object]:
    """What a protocol declares, its protocol bases' included: name -> its function, its property,
    or None for a bare annotation."""
    out: dict[str, object] = {}
    for cls in reversed(proto.__mro__):
        if cls in (object, Protocol, Generic) or not getattr(cls, "_is_protocol", False):
            continue
        out.update({name: None for name in getattr(cls, "__annotations__", {}) if not name.startswith("_")})
        out.update({name: value for name, value in vars(cls).items()
                    if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))})
    return out


def test_every_protocol_declares_something_and_says_what_implements_it():
    assert set(declared(DeliverySource)) == {"recv"}
    assert set(declared(DataChannel)) > set(declared(DeliverySource))  # a channel is a delivery source
    for proto in PROTOCOLS:
        assert declared(proto), proto
        assert "Implemented by" in proto.__doc__ or "Every `DataChannel`" in proto.__doc__, proto


def accepts_calls_shaped_like(impl: object, proto_fn: object) -> None:
    """`impl` (a bound method) takes every call the protocol's function allows: its positional
    parameters by position, its keyword-only ones by name, the optional ones left out or given;
    and where both have a default for a parameter, it is the same."""
    theirs = inspect.signature(impl)
    params = list(inspect.signature(proto_fn).parameters.values())[1:]  # without self
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keywords = [p for p in params if p.kind == p.KEYWORD_ONLY]
    required = [p for p in positional if p.default is p.empty]
    theirs.bind(*(object() for _ in required),
                **{p.name: object() for p in keywords if p.default is p.empty})  # the least call
    theirs.bind(*(object() for _ in positional), **{p.name: object() for p in keywords})  # the fullest
    for p in params:
        other = theirs.parameters.get(p.name)
        if other is not None and p.default is not p.empty and other.default is not other.empty:
            assert other.default == p.default, (impl, p.name)


def conforms(obj: object, proto: type) -> None:
    assert isinstance(obj, proto), f"{type(obj).__name__} is not a {proto.__name__}"
    for name, decl in declared(proto).items():
        if inspect.isfunction(decl):
            accepts_calls_shaped_like(getattr(obj, name), decl)


@pytest.mark.parametrize("make", [lambda: Channel(host="127.0.0.1", sender_id=3),
                                  lambda: TcpChannel(host="127.0.0.1", sender_id=3)], ids=["Channel", "TcpChannel"])
def test_both_transports_are_data_channels_and_their_sends_pending_sends(make):
    ch = make()
    try:
        conforms(ch, DataChannel)
        conforms(ch, DeliverySource)
        host, port = ch.address
        assert isinstance(host, str) and isinstance(port, int) and port > 0
        handle = ch.send(7, [np.arange(4, dtype=np.float32)], [(*ch.address, 0.0)], loss_bounds=0.0,
                         deadline=None, multicast=False)  # to itself, as a round's send is made
        conforms(handle, PendingSend)
        d = ch.recv(timeout=10.0)
        assert d is not None and (d.sender, d.msg_id) == (3, 7)
        (st,) = handle.wait(10.0)
        assert st.result == "exact"
        assert ch.stats()["bytes_sent"] > 0
    finally:
        ch.close()


def test_something_missing_a_member_is_not_one():
    """What isinstance checks: take away any one declared member and the stand-in stops conforming."""
    def stand_in(names):
        return type("StandIn", (), {name: lambda *args, **kwargs: None for name in names})()

    for proto in PROTOCOLS:
        members = declared(proto)
        assert isinstance(stand_in(members), proto)
        for missing in members:
            partial = stand_in(name for name in members if name != missing)
            assert not isinstance(partial, proto), (proto.__name__, missing)


def test_a_plain_delivery_source_is_not_a_data_channel():
    class Feed:  # what the inbox's tests pass it
        def recv(self, timeout=None):
            return None

    assert isinstance(Feed(), DeliverySource) and not isinstance(Feed(), DataChannel)


def test_the_control_client_has_every_member_with_the_protocols_signatures():
    on_class = dict(inspect.getmembers(Client))
    for name, decl in declared(ControlClient).items():
        if inspect.isfunction(decl):
            assert inspect.isfunction(on_class.get(name)), f"Client.{name} is not a method"
            assert inspect.signature(on_class[name]) == inspect.signature(decl), f"Client.{name}'s signature"
        elif isinstance(decl, property) and isinstance(on_class.get(name), property):
            assert inspect.signature(on_class[name].fget) == inspect.signature(decl.fget), f"Client.{name}'s type"
    # The rest (rank, donor, start_clock, coordinator_changes) are a Client's instance attributes.
    key = secrets.token_hex(16)
    coord = Coordinator("protocols-test", key, world_size=1).start()
    client = None
    try:
        client = Client(coord.address, "protocols-test", key, rank=0, connect_timeout=5.0)
        client.register(("127.0.0.1", 9))
        conforms(client, ControlClient)
        assert client.rank == 0 and client.start_clock == 0 and client.donor is None
        assert client.coordinator_changes == 0 and client.following and 0 in client.members
    finally:
        if client is not None:
            client.close()
        coord.stop()
