"""A virtual run's ``--log-dir``: the files a real job writes, for ``p2plearn-sim train``'s peers.

``p2plearn.sim.train.VirtualTraining`` calls it as its rounds go (``flows``, ``sends``, ``round``,
each with every peer's figures at once) and it writes, on the caller's thread (a virtual run has
no round to slow down), what ``RoundLog`` and ``PlanLog`` write for a real one: per virtual peer
``rank-N.jsonl`` (round, virtual time at its end, loss, compute, communication and send seconds,
bytes, its receivers, slow closes), and ``coordinator-0.jsonl`` (a ``"job"`` line saying the clock is
virtual, then a ``"plan"`` line with each round's flows: about 40 bytes a flow, as a rank's line
is about 250 bytes a round). ``write_report`` then draws a virtual run as it draws a real one.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from .plan_log import coordinator_file
from .round_log import rank_file


class SimLog:
    """``n`` virtual peers' logs in ``log_dir`` (made if missing); ``close()`` at the end.
    ``title`` and ``settings`` go in the report's header."""

    def __init__(self, log_dir: str, n: int, *, title: str = "", settings: dict[str, Any] | None = None) -> None:
        os.makedirs(log_dir, exist_ok=True)
        self.n = n
        self._files = [open(rank_file(log_dir, i), "w", encoding="utf-8") for i in range(n)]
        self._plans = open(coordinator_file(log_dir, 0), "w", encoding="utf-8")
        self._write(self._plans, {"kind": "job", "time": 0.0, "clock": "virtual", "title": title, "term": 0,
                                  "settings": settings or {}})
        self._ended = np.zeros(n)  # each peer's virtual time at the end of its last round
        self._edges: list[list[Any]] = []  # the round in progress's flows
        self._bytes = np.zeros(n)
        self._receivers: list[list[int]] = [[] for _ in range(n)]
        self._send_s: np.ndarray | None = None
        self._slow = np.zeros(n, dtype=int)

    def flows(self, src: np.ndarray, dst: np.ndarray, paced: np.ndarray, rate: np.ndarray, sizes: np.ndarray) -> None:
        """The round's flows (more than one call per round: a partitioned round's two phases)."""
        for i, j, p, r in zip(src.tolist(), dst.tolist(), paced.tolist(), rate.tolist()):
            self._edges.append([int(i), int(j), float(r), float(p)])
            self._receivers[int(i)].append(int(j))
            self._bytes[int(i)] += float(sizes[int(i)])

    def sends(self, send_s: np.ndarray, src: np.ndarray, slow: np.ndarray) -> None:
        """Each peer's own sends' time in the round, and which of its flows were closed as slow."""
        self._send_s = np.asarray(send_s, dtype=float)
        np.add.at(self._slow, np.asarray(src, dtype=int), np.asarray(slow, dtype=int))

    def round(self, rnd: int, send_at: np.ndarray, end: np.ndarray, losses: Any) -> None:
        """Round ``rnd`` ended: each peer's compute ended (its sends began) at ``send_at`` and its
        round at ``end`` (virtual seconds); ``losses``: each peer's loss at its last step."""
        losses = [float(x) for x in losses]
        for i, f in enumerate(self._files):
            self._write(f, {"rank": i, "round": rnd, "time": float(end[i]), "loss": losses[i],
                            "compute_s": float(send_at[i] - self._ended[i]), "comm_s": float(end[i] - send_at[i]),
                            "send_s": None if self._send_s is None else float(self._send_s[i]),
                            "bytes_sent": float(self._bytes[i]), "fanout": len(self._receivers[i]),
                            "receivers": self._receivers[i], "slow_closes": int(self._slow[i])})
        members = {str(i): {"clock": rnd + 1, "loss": losses[i]} for i in range(self.n)}
        self._write(self._plans, {"kind": "plan", "time": float(end.max()), "term": 0, "view_version": None,
                                  "min_clock": rnd + 1, "max_clock": rnd + 1, "members": members, "edges": self._edges})
        self._ended = np.array(end, dtype=float)
        self._edges, self._bytes, self._send_s = [], np.zeros(self.n), None
        self._receivers, self._slow = [[] for _ in range(self.n)], np.zeros(self.n, dtype=int)

    def close(self) -> None:
        for f in (*self._files, self._plans):
            f.close()

    @staticmethod
    def _write(f: Any, record: dict[str, Any]) -> None:
        f.write(json.dumps(record) + "\n")
