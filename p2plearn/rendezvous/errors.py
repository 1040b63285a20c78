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

Under torchrun the line goes to torchrun instead, through the error file it gives each rank (each
rank would print the same line), and torchrun's own report of the failed ranks, a traceback and a
summary of 40 lines ending in exit code 1, becomes that line and exit code 2 (`shorten_torchrun_report`,
which p2plearn's torch plugin installs in the ``torchrun`` process), after torchrun's log of the failure:

    (torchrun's log: a SIGTERM sent, a rank failed, no error file for the agent: 2-3 lines)
    p2plearn: error: --sync: must be one of bsp, ssp, partitioned (got 'bogus' ...) [torchrun: ranks 0, 1]

Without the plugin in torchrun's process (p2plearn on PYTHONPATH only, not installed; or
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) torchrun's report stays, with the line in its summary.

Every other exception keeps Python's report, and so does an interactive session (the hook would
end it), and so does any other failure under torchrun. A script that wants a traceback catches the
error and re-raises it as its own.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
from types import TracebackType
from typing import Any

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
        if not _tell_torchrun(line):  # torchrun says it, once for its ranks (shorten_torchrun_report)
            print(line, file=sys.stderr, flush=True)
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


def _tell_torchrun(line: str) -> bool:
    """Under torchrun: put ``line`` in the failure report it prints (else it says only "To enable
    traceback see ..."), through the error file it gives each rank (the format of torch's ``@record``);
    whether it was written."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    try:
        with open(path, "w") as f:
            # py_callstack is what the summary shows; the line stands for the traceback it leaves out
            json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                                  "timestamp": str(int(time.time()))}}}, f)
    except OSError:
        return False  # the summary keeps torchrun's own words; the rank says the line itself
    return True


def shorten_torchrun_report() -> None:
    """In the ``torchrun`` process: when the first rank to fail stopped on a `SetupError` (exit code
    2, its line in its error file) and the others on one too or on torchrun's own SIGTERM, print
    that line with the ranks it stopped and exit with code 2, instead of torchrun's traceback and
    summary; any other failure keeps torchrun's report."""
    if getattr(sys.excepthook, "p2plearn_torchrun", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        line = _setup_errors(error) if kind.__name__ == "ChildFailedError" else None
        if line is None:
            previous(kind, error, tb)
            return
        print(line, file=sys.stderr, flush=True)
        os._exit(EXIT_CODE)

    hook.p2plearn_torchrun = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _setup_errors(error: Any) -> str | None:
    """torchrun's lines for a ChildFailedError of ranks stopped by setup errors (one per distinct
    error, with the ranks it stopped), or None when it is not one."""
    lines: dict[str, list[int]] = {}
    stopped = []
    for rank, failure in (getattr(error, "failures", None) or {}).items():
        message = getattr(failure, "message", "")
        message = str(message.get("message", "") if isinstance(message, dict) else message)
        if failure.exitcode == EXIT_CODE and message.startswith("p2plearn: error:"):
            lines.setdefault(message, []).append(rank)
        elif failure.exitcode in (-signal.SIGTERM, -signal.SIGKILL):
            stopped.append(rank)  # torchrun stops the others once one failed
        else:
            return None
    first, _ = error.get_first_failure()
    if first in stopped or not lines:
        return None
    others = f"; {_ranks(stopped)} stopped by torchrun" if stopped else ""
    return "\n".join(f"{line} [torchrun: {_ranks(ranks)}{others}]" for line, ranks in lines.items())


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, sorted(ranks)))}"


install_excepthook()  # whoever can raise a SetupError imports this module first
