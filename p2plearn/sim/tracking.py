"""Whether the view follows the network: plan, pace, measure and estimate, round after round.

    python -m p2plearn.sim.tracking [--testbed] [--out experiments/results]

`track(network, base_up, base_down, bursts, ...)` runs the loop the control plane runs: each round
SELMCAST plans from the estimator's view as it stood `lag` rounds before (a new view applies
VIEW_LEAD rounds ahead of the fastest peer), `plan_flows` paces the flows (probes included), the
network says what each flow delivered, as the engine's ACK-based rate measures it, and the
estimator takes the round. Meanwhile `bursts` change the true rates. `Trace` holds, after every
round, the true and estimated rate of every end.

Networks: `FlowNetwork` (simulated: each flow at its max-min fair rate on the true links, capped
by its pace; every flow of a round at once) and `p2plearn.sim.tracking_testbed.TestbedNetwork`
(root: one `p2plearn.sim.peer` per namespace, tbf rates changed by `Testbed.set_rate`).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from p2plearn.control import BandwidthEstimator
from p2plearn.selection import NetworkView, Selmcast, flow_probes, plan_flows
from p2plearn.sim.fairness import max_min_rates

# What one round's flows delivered: (round, src, dst, pace, message bytes) -> ACK-timed rate per flow.
Network = Callable[[int, np.ndarray, np.ndarray, np.ndarray, float], np.ndarray]


@dataclass(frozen=True)
class Burst:
    """Peer `peer`'s downlink (or uplink) runs at `factor` of its rate in rounds [start, end)."""

    peer: int
    start: int
    end: int
    factor: float
    uplink: bool = False

    def applies(self, rnd: int) -> bool:
        return self.start <= rnd < self.end


def true_rates(base_up: np.ndarray, base_down: np.ndarray, bursts: list[Burst], rnd: int) -> tuple[np.ndarray, np.ndarray]:
    """The links' rates in round `rnd`: the base rates, with the bursts of that round applied."""
    up, down = base_up.astype(float), base_down.astype(float)
    for b in bursts:
        if b.applies(rnd):
            (up if b.uplink else down)[b.peer] *= b.factor
    return up, down


@dataclass
class Trace:
    """Per round r (rows), per peer (columns): true and estimated rates after round r closed."""

    true_up: list[np.ndarray] = field(default_factory=list)
    true_down: list[np.ndarray] = field(default_factory=list)
    est_up: list[np.ndarray] = field(default_factory=list)
    est_down: list[np.ndarray] = field(default_factory=list)

    def error(self) -> tuple[np.ndarray, np.ndarray]:
        """Relative error of every estimate (rounds x peers), uplinks and downlinks."""
        return (np.array(self.est_up) / np.array(self.true_up) - 1, np.array(self.est_down) / np.array(self.true_down) - 1)

    def within(self, tolerance: float) -> np.ndarray:
        """Per round: whether every estimate is within `tolerance` of its true rate."""
        up, down = self.error()
        return (np.abs(up) <= tolerance).all(axis=1) & (np.abs(down) <= tolerance).all(axis=1)


class FlowNetwork:
    """Simulated links whose rates follow `bursts`: each flow gets its max-min fair share of the
    true uplinks and downlinks, capped by its pace, all flows of a round at once."""

    def __init__(self, base_up: np.ndarray, base_down: np.ndarray, bursts: list[Burst]):
        self.base_up, self.base_down, self.bursts = base_up, base_down, bursts

    def __call__(self, rnd: int, src: np.ndarray, dst: np.ndarray, pace: np.ndarray, size: float) -> np.ndarray:
        up, down = true_rates(self.base_up, self.base_down, self.bursts, rnd)
        return max_min_rates(src, dst, up, down, pace)


def track(network: Network, base_up: np.ndarray, base_down: np.ndarray, bursts: list[Burst], rounds: int, *,
          message_bytes: float, p: int = 2, seed: int = 0, lag: int = 2) -> Trace:
    """Run `rounds` rounds of plan, paced flows and estimation (see the module docstring); the
    estimator starts at the base rates (the topology), as the coordinator does."""
    n = len(base_up)
    estimator = BandwidthEstimator({i: (float(base_up[i]), float(base_down[i])) for i in range(n)})
    policy = Selmcast(seed=seed)
    views = []
    trace = Trace()
    for rnd in range(rounds):
        views.append(estimator.arrays(n))
        v = views[max(0, rnd - lag)]
        view = NetworkView(v["uplink"], v["downlink"], np.full(n, float(message_bytes)), np.ones(n, dtype=bool),
                           uplink_target=v["uplink_target"], downlink_target=v["downlink_target"]).probed(rnd)
        src, dst, pace = plan_flows(view, policy.plan(view, p, rnd))
        delivered = network(rnd, src, dst, pace, message_bytes)
        probe_up, probe_down = flow_probes(view, src, dst)
        probe = np.array(["+".join(e for e, on in (("uplink", u), ("downlink", d)) if on) for u, d in zip(probe_up, probe_down)])
        for i in np.unique(src).tolist():
            mine = src == i
            estimator.observe(i, rnd + 1, {int(j): {"paced": float(q), "rate": float(r), "probe": str(k)}
                                           for j, q, r, k in zip(dst[mine], pace[mine], delivered[mine], probe[mine])})
        estimator.close_round(rnd + 1)
        up, down = true_rates(base_up, base_down, bursts, rnd)
        now = estimator.arrays(n)
        trace.true_up.append(up)
        trace.true_down.append(down)
        trace.est_up.append(now["uplink"])
        trace.est_down.append(now["downlink"])
    return trace


# The scenario: 8 peers, one peer's downlink at a fifth of its rate for 5 rounds. 20 Mbit/s links
# (160 Mbit/s in all): a rate the 2-core testbed host carries with room to spare even while busy;
# at 100 Mbit/s a busy host, not the links, sets the rates it measures. The simulation scales.
PEERS, MBIT, MESSAGE_BYTES, ROUNDS = 8, 20, 250_000, 30
BURST = Burst(peer=3, start=8, end=13, factor=0.2)


def scenario() -> tuple[np.ndarray, np.ndarray, list[Burst]]:
    rate = MBIT * 1e6 / 8
    return np.full(PEERS, rate), np.full(PEERS, rate), [BURST]


def summary(trace: Trace, burst: Burst, tolerance: float = 0.1) -> dict[str, int | None]:
    """Rounds until the burst peer's estimate is within `tolerance` of the burst rate (from the
    burst's start), and until every estimate is within it of the true rates (from its end)."""
    est = np.array(trace.est_up if burst.uplink else trace.est_down)[:, burst.peer]
    true = np.array(trace.true_up if burst.uplink else trace.true_down)[:, burst.peer]
    falls = next((r - burst.start + 1 for r in range(burst.start, burst.end) if abs(est[r] / true[r] - 1) <= tolerance), None)
    within = trace.within(tolerance)
    back = next((r - burst.end + 1 for r in range(burst.end, len(within)) if within[r:].all()), None)
    return {"falls_within_rounds": falls, "recovers_within_rounds": back}


def write(traces: dict[str, Trace], burst: Burst, out: Path) -> None:
    """view_tracking.csv, .md and .png under `out`: the burst peer's estimate against its true rate."""
    out.mkdir(parents=True, exist_ok=True)
    rows = ["source,round,true_bytes_per_s,estimate_bytes_per_s,own_other_end_error,worst_error_other_peers"]
    lines = ["# The view follows a burst", "",
             f"{PEERS} peers at {MBIT} Mbit/s, {MESSAGE_BYTES / 1e6:g} MB messages, SELMCAST p=2; peer {burst.peer}'s "
             f"{'uplink' if burst.uplink else 'downlink'} at {burst.factor:g} of its rate in rounds {burst.start}-"
             f"{burst.end - 1}. Plans use the view of 2 rounds before (the control plane's lead). "
             "`python -m p2plearn.sim.tracking [--testbed]`; view_tracking.csv has every round.", "",
             "| source | rounds until the estimate is within 10% of the burst rate | rounds after the burst until "
             "every estimate is within 10% of the true rate | worst error of the peer's other end during the burst "
             "| worst error of any other peer's ends |", "|---|---|---|---|---|"]
    for name, trace in traces.items():
        up_err, down_err = trace.error()
        this, own = (up_err, down_err) if burst.uplink else (down_err, up_err)
        others = np.maximum(np.abs(np.delete(up_err, burst.peer, axis=1)).max(axis=1),
                            np.abs(np.delete(down_err, burst.peer, axis=1)).max(axis=1))
        true = np.array(trace.true_up if burst.uplink else trace.true_down)[:, burst.peer]
        est = np.array(trace.est_up if burst.uplink else trace.est_down)[:, burst.peer]
        for r in range(len(est)):
            rows.append(f"{name},{r},{true[r]:.0f},{est[r]:.0f},{own[r, burst.peer]:+.3f},{others[r]:.3f}")
        s = summary(trace, burst)
        during = slice(burst.start, burst.end)
        lines.append(f"| {name} | {s['falls_within_rounds']} | {s['recovers_within_rounds']} "
                     f"| {np.abs(own[during, burst.peer]).max():.0%} | {others.max():.0%} |")
    lines += ["", "On the testbed a peer whose downlink is congested also sends slower: the ACKs of its own sends "
              "come back through that downlink (the simulator has no ACK path), so its uplink estimate falls "
              "with the burst and is probed back with it."]
    (out / "view_tracking.csv").write_text("\n".join(rows) + "\n")
    (out / "view_tracking.md").write_text("\n".join(lines) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for k, (name, trace) in enumerate(traces.items()):
        est = np.array(trace.est_down)[:, burst.peer] * 8 / 1e6
        ax.plot(est, marker="o", ms=3, label=f"estimate ({name})")
        if k == 0:
            ax.plot(np.array(trace.true_down)[:, burst.peer] * 8 / 1e6, "k--", lw=1, label="true rate")
    ax.set(xlabel="round", ylabel=f"peer {burst.peer} downlink (Mbit/s)", title="Estimate through a 5-round burst")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "view_tracking.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m p2plearn.sim.tracking", description=__doc__.splitlines()[0])
    parser.add_argument("--testbed", action="store_true", help="also measure on the root testbed")
    parser.add_argument("--out", type=Path, default=Path("experiments/results"),
                        help="directory for the table (CSV, Markdown) and the plot (default: %(default)s)")
    args = parser.parse_args(argv)
    up, down, bursts = scenario()
    traces = {"simulated": track(FlowNetwork(up, down, bursts), up, down, bursts, ROUNDS, message_bytes=MESSAGE_BYTES)}
    if args.testbed:
        from p2plearn.sim.tracking_testbed import TestbedNetwork

        with TestbedNetwork(PEERS, MBIT, bursts, ROUNDS, MESSAGE_BYTES) as network:
            traces["testbed"] = track(network, up, down, bursts, ROUNDS, message_bytes=MESSAGE_BYTES)
    for name, trace in traces.items():
        print(name, summary(trace, BURST), flush=True)
    write(traces, BURST, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
