"""`TrainingStats`: what a peer's rounds did, summed over the job (`DecentralizedOptimizer.stats()`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from p2plearn.sync import RoundStats


@dataclass
class TrainingStats:
    """What `DecentralizedOptimizer.stats()` reports; ``str()`` is the one-line summary."""

    rounds: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    retransmitted: int = 0          # datagrams sent again: the loss the bounds did not tolerate
    average_p: float = 0.0          # the plans' average fanout
    receivers_per_round: float = 0.0  # this peer's own receivers per round
    delivered: float = 1.0          # mean fraction of merged messages that arrived
    merged_per_round: float = 0.0
    comm_s: float = 0.0             # wall time in communication rounds
    compute_s: float = 0.0          # wall time outside them (forward, backward, local step, data)
    cpu_s: float = 0.0              # this process's CPU time (all its threads, the engine's too) since the
                                    # optimizer was made: torch threads spinning on too few cores inflate it
    merges: int = 0                 # messages merged, over all rounds
    mixed_with: set[int] = field(default_factory=set)  # the peers whose messages were merged
    rejoins: int = 0                # times this peer was taken for dead, came back and got the state again
    coordinator_changes: int = 0    # failovers this peer followed
    nonfinite: int = 0              # values of compressed messages refused as NaN or inf (--keep-nonfinite keeps them)
    robust: dict | None = None      # --robust: per sender, merges and how often and how much it was clipped (sync.robust)
    round_times: list[float] = field(default_factory=list)
    send_times: list[float] = field(default_factory=list)  # per round, this peer's own transfer

    def __str__(self) -> str:
        return self.summary()  # print(opt.stats()): one line; the per-round lists stay attributes

    def summary(self) -> str:
        """One line: what this peer did."""
        mixed = ",".join(map(str, sorted(self.mixed_with))) or "none"
        return (f"{self.rounds} rounds, {self.merges} merges, mixed with {len(self.mixed_with)} peers ({mixed}), "
                f"{self.bytes_sent / 1e6:.1f} MB sent, comm {self.comm_s:.1f} s / compute {self.compute_s:.1f} s, "
                f"CPU {self.cpu_s:.1f} s, "
                f"{self.rejoins} rejoins, {self.coordinator_changes} coordinator changes"
                + (f", {self.nonfinite} non-finite values refused" if self.nonfinite else ""))

    def add_round(self, rs: RoundStats) -> None:
        """Count one finished round in the totals and running means."""
        self.rounds += 1
        self.bytes_sent += rs.bytes_sent
        self.retransmitted += rs.retransmitted
        n = self.rounds
        self.average_p += (rs.fanout - self.average_p) / n
        self.receivers_per_round += (len(rs.receivers) - self.receivers_per_round) / n
        self.merged_per_round += (rs.merged - self.merged_per_round) / n
        self.merges += rs.merged
        self.mixed_with.update(rs.merged_from)
        self.delivered += (rs.delivered - self.delivered) / n
        self.round_times.append(rs.comm_s)
        self.send_times.append(rs.send_s)
