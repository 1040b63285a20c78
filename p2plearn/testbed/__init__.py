"""Emulated networks built from topologies with Linux network namespaces (root only).

``up`` builds, for a topology: a switch namespace ``p2pl-NAME-sw`` holding a bridge (IGMP
snooping on, address 10.77.X.254 for measurements); per peer a namespace ``p2pl-NAME-I``
with a veth ``p2pl-pI`` (address 10.77.X.(I+1)/24, a route for 224.0.0.0/4) whose other end
``p2pl-sI`` is a bridge port; tbf shaping of the uplink on ``p2pl-pI`` and of the downlink
(with the node's ``buffer_kb`` as queue) on ``p2pl-sI``; random loss of everything the peer
receives (all IPv4, by an iptables ``statistic`` rule on INPUT); and a scheduler process
that applies the topology's events. Nothing is created in the root namespace.

Python: ``with Testbed("topology/homogeneous-4.json") as tb: tb.run("p0", [...])``.
Shell: ``p2plearn-testbed up|down|status|exec|measure`` (see ``p2plearn.testbed.cli``).
Measurements: ``p2plearn.testbed.measure.measure(tb)``; traffic probes for tests and
experiments: ``p2plearn.testbed.probe`` (neither is imported here, so that both run with
``python -m`` inside namespaces without a second import).
"""

from p2plearn.testbed.system import CommandError, TestbedError
from p2plearn.testbed.testbed import Testbed

__all__ = ["CommandError", "Testbed", "TestbedError"]
