"""Helpers of the monitor tests (a unique module name: every test folder is on sys.path)."""

import contextlib
import json
import secrets
import time
import urllib.error
import urllib.request

import zmq

from p2plearn.control import protocol as p
from p2plearn.keys import control_key

JOB = "monitor-job"


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def state(dashboard, timeout: float = 5.0) -> dict:
    status, body = get(f"http://127.0.0.1:{dashboard.port}/api/state", timeout)
    assert status == 200, body
    return json.loads(body)


def wait_state(dashboard, predicate, timeout: float, what: str) -> dict:
    """The dashboard's state once ``predicate(state)`` holds."""
    return wait_for(lambda: (lambda s: s if predicate(s) else None)(state(dashboard)), timeout, what)


def wait_for(condition, timeout: float, what: str):
    """Poll ``condition()`` until it returns something true; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout:g} s: {what}")


class RawMembers:
    """``n`` members speaking the wire protocol on bare sockets: no client threads, so that 64
    of them cost a test almost nothing but the coordinator's own work."""

    def __init__(self, address: str, key: str, n: int) -> None:
        self._key = control_key(key)
        self.socks = []
        for rank in range(n):
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
            self.socks.append(sock)
            self.request(rank, {"type": p.REGISTER, "rank": rank, "session": f"s{rank}", "host": "sim",
                                "engine": ["127.0.0.1", 20000 + rank], "clock": 0})

    def request(self, rank: int, body: dict) -> dict:
        self.socks[rank].send_multipart(p.pack(self._key, JOB, {**body, "id": 1}))
        assert self.socks[rank].poll(5000), "no reply"
        reply, _ = p.unpack(self._key, JOB, self.socks[rank].recv_multipart())
        assert reply["type"] == p.OK, reply
        return reply

    def report(self, rank: int, clock: int, loss: float, counts: dict | None = None) -> None:
        """One round's report (one-way): flows to the next two ranks, a load, and ``counts`` if given."""
        n = len(self.socks)
        links = {str((rank + k) % n): {"rate": 1e6 * (rank + 1), "paced": 1.2e6 * (rank + 1)} for k in (1, 2)}
        self.socks[rank].send_multipart(p.pack(self._key, JOB, {
            "type": p.REPORT, "rank": rank, "session": f"s{rank}", "clock": clock, "loss": loss, "step_time": 0.02,
            "message_bytes": 4096, "links": links, "load": {"compute_s": 0.01, "merge_s": 0.001},
            **({"counts": counts} if counts is not None else {})}))

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


@contextlib.contextmanager
def monitored(world_size: int):
    """A coordinator with its dashboard on a free loopback port, and `world_size` raw members joined
    to it: (dashboard, members); everything is stopped after, also on failure."""
    from p2plearn.control import Coordinator
    from p2plearn.monitor import attach

    key = secrets.token_hex(32)
    coordinator = Coordinator(JOB, key, world_size=world_size, heartbeat=0.1)
    dashboard = attach(coordinator, "127.0.0.1:0", key)
    coordinator.start()
    try:
        members = RawMembers(coordinator.address, key, world_size)
        try:
            wait_state(dashboard, lambda s: len(s["peers"]) == world_size, 5, f"{world_size} peers")
            yield dashboard, members
        finally:
            members.close()
    finally:
        coordinator.stop()
        dashboard.stop()
