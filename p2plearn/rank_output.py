"""A rank's output under mpirun: whole lines, each tagged with the rank (``[3] ...``), as
``p2plearn-run`` shows its peers' lines.

mpirun forwards what each rank writes in the pieces the rank wrote them; Python block-buffers a pipe,
so a piece may end mid-line and another rank's line land inside it, with nothing to say which rank
printed what. ``p2plearn-run`` reads its peers' lines whole and tags them itself; under mpirun,
``p2plearn.init()`` has this process's ``sys.stdout`` and ``sys.stderr`` write whole tagged lines.
"""
from __future__ import annotations

import io
import sys
import threading
from collections.abc import Mapping
from typing import TextIO

# Set by mpirun for its ranks (Open MPI, then MPICH and Intel MPI); p2plearn-run sets neither.
MPIRUN_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK")


class TaggedLines(io.TextIOBase):
    """A text stream that writes ``tag`` + each line to ``stream``, a whole line per write, flushed
    at once. A line without its newline waits for it (or for ``flush()``: a prompt, a progress bar's
    ``end=""``), so that no other rank's line lands inside it. Writes from several threads are
    serialised (``_lock``)."""

    def __init__(self, stream: TextIO, tag: str) -> None:
        self.stream = stream
        self.tag = tag
        self._lock = threading.Lock()
        self._partial = ""        # the current line's text not written yet
        self._mid_line = False    # the current line's start (and tag) is written already

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
            if lines:
                first, *rest = lines
                whole = ("" if self._mid_line else self.tag) + first + "\n" + "".join(
                    f"{self.tag}{line}\n" for line in rest)
                self._mid_line = False
                self.stream.write(whole)
                self.stream.flush()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._partial:
                self.stream.write(("" if self._mid_line else self.tag) + self._partial)
                self._partial, self._mid_line = "", True
            self.stream.flush()

    # What code handed sys.stdout may ask of it: the stream's own.
    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self.stream.errors

    @property
    def buffer(self) -> io.BufferedIOBase:
        """The stream's bytes (untagged): for code that writes bytes to ``sys.stdout.buffer``."""
        return self.stream.buffer


def tag_under_mpirun(environ: Mapping[str, str], rank: int) -> bool:
    """Under mpirun, have ``sys.stdout`` and ``sys.stderr`` write whole lines tagged ``[rank] ``;
    whether it did (not under other launchers, nor twice)."""
    if not any(var in environ for var in MPIRUN_RANK_VARS) or isinstance(sys.stdout, TaggedLines):
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout = TaggedLines(sys.stdout, f"[{rank}] ")
    sys.stderr = TaggedLines(sys.stderr, f"[{rank}] ")
    return True
