"""A topology built as network namespaces on this machine: one switch, one namespace per peer."""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import Any, Sequence

from p2plearn.testbed import state
from p2plearn.testbed.system import (
    TestbedError,
    check_can_build,
    command,
    namespace_testbeds,
    python_module,
    remove_namespaces,
    stop_processes,
)
from p2plearn.topology import DEFAULT_BUFFER_KB, Topology, load

NAME_PATTERN = re.compile(r"[a-z0-9_]{1,16}")
BRIDGE = "p2pl-br"
LOSS_CHAIN = "P2PL-LOSS"
MULTICAST_ROUTE = "224.0.0.0/4"
# The bridge floods every group to every port until it trusts its snooping, one query response
# interval after its querier starts (the default 10 s: a job's first rounds got every sender's
# multicast on every downlink); hosts answer its queries within this too. In centiseconds.
QUERY_RESPONSE_CS = 50
# Each testbed gets its own 10.77.X.0/24; the switch holds .254 (for ``measure``), peers .1 up.
SUBNET_FORMAT = "10.77.{}.{}"
SWITCH_HOST = 254
MAX_PEERS = 253
# tbf bucket: enough for 1 ms at the rate, at least two full frames. A bigger bucket lets
# short bursts through faster than the rate; a smaller one starves Python senders.
BURST_S = 0.001
MIN_BURST_BYTES = 2 * 1514


class Testbed:
    """A topology built with network namespaces (needs root; see ``p2plearn.testbed``).

    topology: a Topology or the path of a topology file.
    name: short name ([a-z0-9_], at most 16 characters) that prefixes every namespace
        (``p2pl-NAME-sw``, ``p2pl-NAME-0``, ...); None picks a free ``tbN``. Give distinct
        names to run several testbeds at once.

    Use as ``with Testbed(topology) as tb: ...``: the network is built on entry and removed
    on exit, also when the body raises.
    """

    def __init__(self, topology: Topology | str | os.PathLike, name: str | None = None):
        self.topology = topology if isinstance(topology, Topology) else load(topology)
        if name is not None and not NAME_PATTERN.fullmatch(name):
            raise TestbedError(f"bad testbed name {name!r}: use 1-16 of [a-z0-9_]")
        self.name = name
        self.subnet_index: int | None = None
        self.started_at: float | None = None  # time.monotonic() when events' at_s count from
        self._links = {peer: self.topology.base_link(peer) for peer in self.topology.peers}
        self._processes: list[subprocess.Popen] = []
        self._owns_namespaces = False  # only then may down() delete p2pl-NAME-*

    @classmethod
    def attach(cls, name: str) -> Testbed:
        """The running testbed ``name`` (built by another process), from its state file."""
        saved = state.read_state(name)
        if saved is None:
            raise TestbedError(f"no testbed named {name!r} (see p2plearn-testbed status)")
        testbed = cls(Topology.from_data(saved["topology"], saved["source"]), name)
        testbed.subnet_index = saved["subnet_index"]
        testbed.started_at = saved["started_at"]
        testbed._owns_namespaces = True
        return testbed

    def __enter__(self) -> Testbed:
        return self.up()

    def __exit__(self, *exc_info: Any) -> None:
        self.down()

    # --- names and addresses -------------------------------------------------------

    @property
    def peers(self) -> list[str]:
        """Peer names in topology order."""
        return self.topology.peers

    def _index(self, peer: str | int) -> int:
        if isinstance(peer, int) and 0 <= peer < len(self.peers):
            return peer
        if peer in self.peers:
            return self.peers.index(peer)
        raise TestbedError(f"testbed {self.name}: no peer {peer!r} (peers: {', '.join(self.peers)})")

    def namespace(self, peer: str | int) -> str:
        """The network namespace ``peer`` (name or index) runs in."""
        return f"p2pl-{self.name}-{self._index(peer)}"

    @property
    def switch_namespace(self) -> str:
        """The namespace holding the bridge all peers hang off."""
        return f"p2pl-{self.name}-sw"

    def interface(self, peer: str | int) -> str:
        """``peer``'s network interface inside its namespace (e.g. for GLOO_SOCKET_IFNAME)."""
        return f"p2pl-p{self._index(peer)}"

    def _switch_port(self, peer: str | int) -> str:
        return f"p2pl-s{self._index(peer)}"

    def address(self, peer: str | int) -> str:
        """``peer``'s IPv4 address (reachable from the other peers' namespaces only)."""
        return SUBNET_FORMAT.format(self.subnet_index, self._index(peer) + 1)

    @property
    def switch_address(self) -> str:
        """The switch's own address: traffic to it crosses exactly one peer's link."""
        return SUBNET_FORMAT.format(self.subnet_index, SWITCH_HOST)

    def link(self, peer: str | int) -> dict[str, float]:
        """``peer``'s current uplink_mbit, downlink_mbit, buffer_kb and loss, as last set here."""
        return dict(self._links[self.peers[self._index(peer)]])

    # --- life cycle ----------------------------------------------------------------

    def up(self) -> Testbed:
        """Build the network and start the event scheduler; removes what it built on failure."""
        check_can_build()
        taken = namespace_testbeds() | state.state_names()
        if self.name is None:
            self.name = next(f"tb{i}" for i in range(len(taken) + 1) if f"tb{i}" not in taken)
        elif self.name in taken:
            raise TestbedError(
                f"testbed name {self.name!r} is taken (remove it: p2plearn-testbed down {self.name})"
            )
        if self.topology.has_edges:
            raise TestbedError(
                f"{self.topology.source}: the testbed builds one shared switch; remove the edges"
            )
        if len(self.peers) > MAX_PEERS:
            raise TestbedError(f"{self.topology.source}: at most {MAX_PEERS} peers per testbed")
        self.subnet_index = self._free_subnet_index()
        self._owns_namespaces = True
        try:
            self._save_state()  # first, so that a half-built testbed is known by its state too
            self._build()
            self.started_at = time.monotonic()
            self._save_state()
            self._start_scheduler()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop every process in the testbed (the scheduler too) and delete its namespaces."""
        stop_processes([process.pid for process in self._processes])
        for process in self._processes:
            process.wait()  # reap, so that no zombie is left behind
        self._processes.clear()
        if self._owns_namespaces:
            remove_namespaces(self.name)
            state.remove_state(self.name)

    def _free_subnet_index(self) -> int:
        used = {saved["subnet_index"] for name in state.state_names() if (saved := state.read_state(name))}
        return min(set(range(256)) - used)

    def _save_state(self) -> None:
        state.write_state(
            self.name,
            {
                "source": self.topology.source,
                "topology": self.topology.to_data(),
                "subnet_index": self.subnet_index,
                "started_at": self.started_at,
                "created": time.time(),
            },
        )

    def _build(self) -> None:
        switch = self.switch_namespace
        command("ip", "netns", "add", switch)
        command("ip", "-n", switch, "link", "set", "lo", "up")
        # IGMP snooping with the bridge as querier: multicast reaches only the ports that
        # joined the group, as on a real switch, instead of flooding every downlink. The querier
        # speaks IGMPv3 so the hosts do too: in v2 a host that hears another member's report for
        # a group suppresses its own, and this bridge (which forwards reports) then never learns
        # that host's port (measured: 2 of 24 memberships missing, every round, on 8 peers at p=3).
        # The querier goes on last: it trusts snooping one response interval after that.
        command("ip", "-n", switch, "link", "add", BRIDGE, "type", "bridge", "mcast_snooping", "1",
                "mcast_igmp_version", "3", "mcast_query_response_interval", str(QUERY_RESPONSE_CS))
        command("ip", "-n", switch, "link", "set", BRIDGE, "type", "bridge", "mcast_querier", "1")
        command("ip", "-n", switch, "addr", "add", f"{self.switch_address}/24", "dev", BRIDGE)
        command("ip", "-n", switch, "link", "set", BRIDGE, "up")
        for peer in self.peers:
            self._build_peer(peer)

    def _build_peer(self, peer: str) -> None:
        namespace, interface, port = self.namespace(peer), self.interface(peer), self._switch_port(peer)
        command("ip", "netns", "add", namespace)
        command("ip", "-n", namespace, "link", "set", "lo", "up")
        # Both veth ends are created inside their namespaces: nothing touches the root one.
        command("ip", "-n", namespace, "link", "add", interface, "type", "veth",
                "peer", "name", port, "netns", self.switch_namespace)
        command("ip", "-n", self.switch_namespace, "link", "set", port, "master", BRIDGE, "up")
        command("ip", "-n", namespace, "addr", "add", f"{self.address(peer)}/24", "dev", interface)
        command("ip", "-n", namespace, "link", "set", interface, "up")
        command("ip", "-n", namespace, "route", "add", MULTICAST_ROUTE, "dev", interface)
        self._iptables(peer, "-N", LOSS_CHAIN)
        self._iptables(peer, "-A", "INPUT", "-j", LOSS_CHAIN)
        if not self.topology.multicast(peer):  # as behind a router: groups neither reach it nor leave it
            for chain in ("INPUT", "OUTPUT"):
                self._iptables(peer, "-A", chain, "-d", MULTICAST_ROUTE, "-j", "DROP")
        self._shape_uplink(peer)
        self._shape_downlink(peer)
        self._apply_loss(peer)

    def _start_scheduler(self) -> None:
        """Apply the topology's events in a process of its own, inside the switch namespace.

        Living in a testbed namespace, it is found and stopped by ``down`` even after the
        process that ran ``up`` has exited or crashed.
        """
        if not any(self.topology.events(peer) for peer in self.peers):
            return
        argv, env = python_module("p2plearn.testbed.scheduler", self.name)
        with open(state.log_path(self.name), "wb") as log:
            self._processes.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", self.switch_namespace, *argv],
                    env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C meant for the caller must not stop it
                )
            )

    # --- processes -----------------------------------------------------------------

    def run(
        self,
        peer: str | int,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        **popen_kwargs: Any,
    ) -> subprocess.Popen:
        """Start ``argv`` inside ``peer``'s namespace; it is stopped by ``down`` at the latest.

        env: variables added to (or replacing) this process's environment, e.g.
            ``{"GLOO_SOCKET_IFNAME": tb.interface(peer)}``.
        popen_kwargs: passed to subprocess.Popen (stdout=, cwd=, ...).
        """
        return self._start(self.namespace(peer), argv, env, popen_kwargs)

    def run_on_switch(
        self, argv: Sequence[str], env: dict[str, str] | None = None, **popen_kwargs: Any
    ) -> subprocess.Popen:
        """Like ``run``, in the switch namespace, reachable at ``switch_address``."""
        return self._start(self.switch_namespace, argv, env, popen_kwargs)

    def _start(
        self, namespace: str, argv: Sequence[str], env: dict[str, str] | None, popen_kwargs: dict
    ) -> subprocess.Popen:
        process = subprocess.Popen(
            ["ip", "netns", "exec", namespace, *argv],
            env=None if env is None else {**os.environ, **env},
            **popen_kwargs,
        )
        self._processes.append(process)
        return process

    # --- link changes --------------------------------------------------------------

    def set_rate(
        self,
        peer: str | int,
        up_mbit: float | None = None,
        down_mbit: float | None = None,
        buffer_kb: float | None = None,
    ) -> None:
        """Change ``peer``'s uplink, downlink and switch-port buffer; None keeps a value."""
        link = self._links[self.peers[self._index(peer)]]
        for field, value in (("uplink_mbit", up_mbit), ("downlink_mbit", down_mbit), ("buffer_kb", buffer_kb)):
            if value is not None and not value > 0:
                raise ValueError(f"{field} must be positive, got {value!r}")
        if up_mbit is not None:
            link["uplink_mbit"] = float(up_mbit)
            self._shape_uplink(peer)
        if down_mbit is not None or buffer_kb is not None:
            link["downlink_mbit"] = float(down_mbit or link["downlink_mbit"])
            link["buffer_kb"] = float(buffer_kb or link["buffer_kb"])
            self._shape_downlink(peer)

    def set_loss(self, peer: str | int, loss: float) -> None:
        """Drop this fraction (in [0, 1)) of every IPv4 packet ``peer`` receives, at random."""
        if not 0 <= loss < 1:
            raise ValueError(f"loss must be in [0, 1), got {loss!r}")
        self._links[self.peers[self._index(peer)]]["loss"] = float(loss)
        self._apply_loss(peer)

    def _shape_uplink(self, peer: str | int) -> None:
        # The sending host's own queue: as deep as a default switch port.
        link = self.link(peer)
        self._tbf(self.namespace(peer), self.interface(peer), link["uplink_mbit"], DEFAULT_BUFFER_KB)

    def _shape_downlink(self, peer: str | int) -> None:
        # The switch port towards the peer: where incast overflows the buffer.
        link = self.link(peer)
        self._tbf(self.switch_namespace, self._switch_port(peer), link["downlink_mbit"], link["buffer_kb"])

    @staticmethod
    def _tbf(namespace: str, device: str, mbit: float, queue_kb: float) -> None:
        burst = max(MIN_BURST_BYTES, int(mbit * 1e6 / 8 * BURST_S))
        # A new qdisc under another handle, not a change of the old one: a changed tbf can
        # keep a GSO packet at its head that is bigger than the new bucket, which then
        # stalls the link until the bucket grows again. Queued packets are dropped.
        shown = command("tc", "-n", namespace, "qdisc", "show", "dev", device, "root").split()
        handle = "2:" if shown[1:3] == ["tbf", "1:"] else "1:"
        command("tc", "-n", namespace, "qdisc", "replace", "dev", device, "root", "handle", handle,
                "tbf", "rate", f"{int(mbit * 1e6)}bit", "burst", str(burst),
                "limit", str(int(queue_kb * 1024)))

    def _apply_loss(self, peer: str | int) -> None:
        # Drops at INPUT, all of IPv4 (UDP, TCP, ICMP): loss on what the peer receives.
        self._iptables(peer, "-F", LOSS_CHAIN)
        loss = self.link(peer)["loss"]
        if loss > 0:
            self._iptables(peer, "-A", LOSS_CHAIN, "-m", "statistic", "--mode", "random",
                           "--probability", f"{loss:.6f}", "-j", "DROP")

    def _iptables(self, peer: str | int, *args: str) -> None:
        command("ip", "netns", "exec", self.namespace(peer), "iptables", *args)
