"""``--log-dir DIR``: each rank's per-round statistics, as JSON lines and as TensorBoard event files.

Rank N appends one JSON object per round to ``DIR/rank-N.jsonl`` (``ROUND_FIELDS``: the round,
its wall-clock time, the loss, where its time went, bytes, what was delivered and merged,
deadline hits and slow closes) and, when the ``tensorboard`` package is installed, writes the
same figures as scalars to ``DIR/rank-N/`` (``tensorboard --logdir DIR`` shows a run per rank).
Without it, the JSON lines alone are written and rank 0 says so in one line.

The round pays one append to a bounded buffer (``add``, under a lock held for that append only);
a thread of its own writes the buffer every ``FLUSH_S`` seconds and at ``close()`` (or at the
interpreter's exit, for a script that never closes its optimizer). A buffer
full (``MAX_PENDING`` rounds unwritten: a stalled disk) drops its oldest round, counted and said
at close: the training never waits on the log. ``p2plearn.monitor.write_report(DIR, "job.html")``
reads these files back (``read_rounds``).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import sys
import threading
import time
from collections import deque
from typing import Any

FLUSH_S = 2.0          # seconds between writes (what a crash loses at most); lower for a livelier TensorBoard
MAX_PENDING = 10_000   # rounds held unwritten at most (a few MB); beyond, the oldest is dropped and counted
NO_TENSORBOARD = "p2plearn: --log-dir: writing JSON lines only; TensorBoard event files need `pip install tensorboard`"
# The JSON line's fields that TensorBoard gets as scalars, by tag.
SCALARS = {"loss": "loss", "compute_s": "time/compute_s", "comm_s": "time/comm_s", "send_s": "time/send_s",
           "bytes_sent": "bytes/sent", "retransmitted": "bytes/retransmitted_datagrams",
           "delivered": "round/delivered", "merged": "round/merged", "fanout": "round/fanout",
           "deadline_hits": "round/deadline_hits", "slow_closes": "round/slow_closes"}


def rank_file(log_dir: str, rank: int) -> str:
    """Where rank ``rank``'s JSON lines go."""
    return os.path.join(log_dir, f"rank-{rank}.jsonl")


def round_record(rank: int, rs: Any, *, loss: float | None, compute_s: float, when: float) -> dict[str, Any]:
    """One JSON line: a ``RoundStats`` (``rs``) of ``rank`` with its loss and the compute before it.
    ``comm_s``: the round's communication, ``send_s`` this peer's own transfers within it (the rest
    of ``comm_s`` is waiting: for senders, the deadline, the merge)."""
    return {"rank": rank, "round": rs.round, "time": round(when, 3), "loss": loss, "compute_s": compute_s,
            "comm_s": rs.comm_s, "send_s": rs.send_s, "planned_s": rs.planned_s, "bytes_sent": rs.bytes_sent,
            "retransmitted": rs.retransmitted, "delivered": rs.delivered, "merged": rs.merged, "fanout": rs.fanout,
            "receivers": list(rs.receivers), "deadline_hits": rs.results.get("deadline", 0),
            "slow_closes": rs.results.get("slow", 0), "results": dict(rs.results)}


class RoundLog:
    """Rank ``rank``'s log in ``log_dir`` (made if missing). ``add`` a round, ``close()`` at the end.

    - ``tensorboard``: write event files too (default: when the package is installed).
    """

    def __init__(self, log_dir: str, rank: int, *, tensorboard: bool | None = None) -> None:
        os.makedirs(log_dir, exist_ok=True)
        self.log_dir, self.rank = log_dir, rank
        self.tensorboard = importlib.util.find_spec("tensorboard") is not None if tensorboard is None else tensorboard
        if not self.tensorboard and rank == 0:
            print(NO_TENSORBOARD, file=sys.stderr, flush=True)
        self.dropped = 0  # rounds dropped from a full buffer (under _lock)
        self._pending: deque[dict[str, Any]] = deque()  # under _lock: the trainer appends, the writer takes
        self._lock = threading.Lock()
        self._last_compute = 0.0  # the trainer's: its compute total at the previous round
        self._file = open(rank_file(log_dir, rank), "a", encoding="utf-8")  # the writer thread's from here on
        self._writer: Any = None  # SummaryWriter, made on the writer thread (its import takes a second)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"p2plearn-log-{rank}", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def add(self, rs: Any, *, loss: float | None, compute_total: float) -> None:
        """A finished round (``RoundStats``), the loss it started with, and this peer's compute so
        far (``TrainingStats.compute_s``: the round's own is the difference from the last)."""
        record = round_record(self.rank, rs, loss=loss, compute_s=max(0.0, compute_total - self._last_compute),
                              when=time.time())
        self._last_compute = compute_total
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append(record)

    def close(self) -> None:
        """Write what is left and close the files (a second call does nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        atexit.unregister(self.close)
        if self.dropped:
            print(f"p2plearn rank {self.rank}: --log-dir: {self.dropped} rounds were not logged (the disk did not keep "
                  f"up)", file=sys.stderr, flush=True)

    def _run(self) -> None:
        try:
            if self.tensorboard:
                try:
                    from torch.utils.tensorboard import SummaryWriter
                except ImportError as exc:  # tensorboard installed, and a dependency of it broken
                    print(f"p2plearn rank {self.rank}: --log-dir: no event files ({exc})", file=sys.stderr, flush=True)
                else:
                    self._writer = SummaryWriter(log_dir=os.path.join(self.log_dir, f"rank-{self.rank}"),
                                                 flush_secs=int(FLUSH_S) or 1)
            while not self._stop.wait(FLUSH_S):
                self._write()
        finally:
            self._write()
            self._file.close()
            if self._writer is not None:
                self._writer.close()

    def _write(self) -> None:
        with self._lock:
            records, self._pending = self._pending, deque()
        for record in records:
            self._file.write(json.dumps(record) + "\n")
            if self._writer is not None:
                step = record["round"]
                for field, tag in SCALARS.items():
                    if record[field] is not None:
                        self._writer.add_scalar(tag, record[field], step, walltime=record["time"])
        self._file.flush()
        if self._writer is not None:
            self._writer.flush()


def read_rounds(path: str) -> list[dict[str, Any]]:
    """The records of one JSON lines file; a line cut short (a killed writer) or not an object is skipped."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records
