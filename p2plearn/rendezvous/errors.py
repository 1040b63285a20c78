"""Mistakes in how a job was set up, reported alike under every launcher: one line, exit code 2.

A `SetupError` is something the user fixes before running again: an option or variable that
cannot be taken, a port held by another program, a secret too short, a checkpoint of another job.
Its message says what and how to fix it in one line, so a traceback adds only noise (under mpirun
or torchrun, one per rank, around the launcher's own report). ``p2plearn-run`` checks what it can
before anything starts and exits with code 2; the same mistakes found inside a peer (under mpirun,
torchrun or srun, or a script's own ``init()``, optimizer or ``checkpoint.load``) end that process
the same way: importing this module installs `install_excepthook`'s hook, so every module that can
raise a `SetupError` has it in place (``import p2plearn`` alone imports nothing). It lives with
the rendezvous, the bottom of runtime and launch, so that options and checkpoints can use it too:

    p2plearn: error: --sync: must be one of bsp, ssp, partitioned (got 'bogus' from P2PLEARN_SYNC)

Under torchrun the line also stands in its failure summary. Every other exception keeps Python's report, and so does an interactive session (the hook would
end it). A script that wants a traceback catches the error and re-raises it as its own.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from types import TracebackType

EXIT_CODE = 2  # a usage error's, as p2plearn-run's and argparse's


class SetupError(Exception):
    """A mistake in the job's setup, named in one line with its fix; uncaught it ends the process
    with that line and exit code 2 (see the module's docstring)."""


def install_excepthook() -> None:
    """Report an uncaught `SetupError` as one line and exit with code 2; idempotent."""
    if getattr(sys.excepthook, "p2plearn", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if not issubclass(kind, SetupError) or sys.flags.interactive or hasattr(sys, "ps1"):
            previous(kind, error, tb)
            return
        line = f"p2plearn: error: {' '.join(str(error).split())}"
        print(line, file=sys.stderr, flush=True)
        _tell_torchrun(line)
        # Python's own exit code for an uncaught exception is 1 and cannot be changed from here:
        # run the exit handlers as a normal exit would (logging's flush among them), then leave with 2.
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass  # a closed pipe: nothing left to say there
        os._exit(EXIT_CODE)

    hook.p2plearn = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _tell_torchrun(line: str) -> None:
    """Under torchrun: put ``line`` in the failure summary it prints (else it says only "To enable
    traceback see ..."), through the error file it gives each rank (the format of torch's ``@record``)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w") as f:
            # py_callstack is what the summary shows; the line stands for the traceback it leaves out
            json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                                  "timestamp": str(int(time.time()))}}}, f)
    except OSError:
        pass  # the summary keeps torchrun's own words


install_excepthook()  # whoever can raise a SetupError imports this module first
