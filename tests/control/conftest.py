"""Fixtures of the control-plane tests: an in-process coordinator and clients that always close."""

import secrets

import pytest

from p2plearn.control import Client, Coordinator

from control_helpers import JOB


@pytest.fixture
def key():
    return secrets.token_hex(32)


@pytest.fixture
def coordinator(key):
    coord = Coordinator(JOB, key, world_size=3).start()
    yield coord
    coord.stop()


@pytest.fixture
def connect(coordinator, key):
    """``connect(rank, engine=None, **kw)`` -> a registered Client, closed after the test."""
    clients = []

    def make(rank, engine=None, *, join=False, register=True, **kwargs):
        client = Client(coordinator.address, JOB, key, rank=rank, connect_timeout=5.0, **kwargs)
        clients.append(client)
        if register:
            client.register(engine, join=join)
        return client

    yield make
    for client in clients:
        client.close()
