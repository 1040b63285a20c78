"""Flow-level simulator of synchronization rounds, for thousands of peers.

`Simulator(view, policy=..., p=..., sync="bsp"|"ssp", ...).run(rounds)` -> SimResult with per-round
time, average p and delivered fraction; `Simulator.from_topology(topology, message_bytes)` builds one
from a topology file's rates and loss. `max_min_rates` is the fair-sharing kernel; `plan_flows`
turns a plan into paced flows. `p2plearn.sim.validate` measures the same rounds on the testbed.
"""
from p2plearn.sim.fairness import max_min_rates
from p2plearn.selection import plan_flows
from p2plearn.sim.simulator import WIRE_EFFICIENCY, RoundResult, SimResult, Simulator

__all__ = ["Simulator", "SimResult", "RoundResult", "WIRE_EFFICIENCY", "max_min_rates", "plan_flows"]
