"""The launcher's output: peer lines tagged with their rank, per-rank logs, and the progress line."""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections import deque
from typing import IO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from ..control import Progress

PREFIX = "p2plearn-run"


class Output:
    """Write peer lines as ``[rank] text`` (stdout lines to stdout, stderr lines to stderr).

    - ``log_dir``: also keep ``rank-N.log`` per rank there (both streams, untagged).
    - ``live``: one live progress line with rich (default: when stdout is a terminal); otherwise
      a plain progress line every ``plain_every`` seconds while rounds advance.
    - ``tail``: how many stderr lines per rank to keep for the failure report.
    """

    def __init__(self, log_dir: str | None = None, *, live: bool | None = None,
                 plain_every: float = 5.0, tail: int = 20) -> None:
        self.log_dir = log_dir
        self.plain_every = plain_every
        self._tail = tail
        self._lock = threading.Lock()
        self._logs: dict[int, IO[str]] = {}
        self._stderr: dict[int, deque[str]] = {}
        self._last_plain = -math.inf  # the first progress line is shown (monotonic() may start near 0 at boot)
        self._last_clock: int | None = None  # the slowest clock of the last plain progress line
        self._live = None
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
        if sys.stdout.isatty() if live is None else live:
            self._live = Live(console=Console(), auto_refresh=False, transient=True)
            self._live.start()

    def peer(self, rank: int) -> None:
        """Prepare for ``rank``'s lines (opens its log)."""
        self._stderr[rank] = deque(maxlen=self._tail)
        if self.log_dir:
            self._logs[rank] = open(os.path.join(self.log_dir, f"rank-{rank}.log"), "a", buffering=1)

    def line(self, rank: int, text: str, err: bool = False) -> None:
        """One line a peer printed (without its newline)."""
        with self._lock:
            if err:
                self._stderr[rank].append(text)
            if rank in self._logs:
                self._logs[rank].write(text + "\n")
            self._emit(f"[{rank}] {text}", err)

    def stderr_tail(self, rank: int) -> list[str]:
        with self._lock:
            return list(self._stderr.get(rank, ()))

    def message(self, text: str) -> None:
        """A line of the launcher's own (to stderr)."""
        with self._lock:
            self._emit(f"{PREFIX}: {text}", err=True)

    def progress(self, p: Progress, rate: float | None, world_size: int, final: bool = False) -> None:
        """Show the job's progress: rounds, rounds/s (None: not known yet), loss and the slowest
        peer; ``final``: the job is over and ``p`` is how it ended: one plain closing line with the
        last round any peer reported and the last loss (nothing when no round ran)."""
        loss = f"loss {p.loss:.4f}" if p.loss is not None else "loss -"
        if final:
            # Built from the end's progress, never from the last line shown while peers ran: that
            # one may be seconds old (its clocks, and peers that had left since).
            alive = "all ranks left" if not p.alive else \
                f"{p.alive} of {world_size} ranks stopped without leaving the job"
            with self._lock:
                if p.max_clock > 0:
                    self._emit(f"{PREFIX}: round {p.max_clock} | {loss} | {alive}", err=False)
            return
        speed = f"{rate:.2f}" if rate is not None else "-"
        text = (f"round {p.min_clock}" + (f"..{p.max_clock}" if p.max_clock != p.min_clock else "")
                + f" | {speed} rounds/s | {loss} | slowest rank {p.slowest} | {p.alive}/{world_size} alive")
        with self._lock:
            if self._live is not None:
                self._live.update(Text(text, style="bold"), refresh=True)
            # Plain lines only while peers train: the end of the job (peers leaving) is the final
            # line's, printed after every plain one.
            if not (p.max_clock > 0 and p.alive):
                return
            if self._live is None and p.min_clock != self._last_clock and \
                    time.monotonic() - self._last_plain >= self.plain_every:
                self._last_plain, self._last_clock = time.monotonic(), p.min_clock
                self._emit(f"{PREFIX}: {text}", err=False)

    def close(self) -> None:
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None
            for log in self._logs.values():
                log.close()
            self._logs.clear()

    def _emit(self, text: str, err: bool) -> None:
        """Called with the lock held."""
        if self._live is not None:
            # Through rich so that the live line stays below the scrolling output.
            self._live.console.print(Text(text, style="red" if err else ""), soft_wrap=True)
            return
        stream = sys.stderr if err else sys.stdout
        stream.write(text + "\n")
        stream.flush()
