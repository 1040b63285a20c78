"""p2plearn-run's checks before anything starts: each mistake is one line (`UsageError`), exit code 2.

``p2plearn.launch.run`` runs them in order: flags and options (its parser), the hosts and their
slots (``p2plearn.launch.hosts``), the command and its script (`check_command`), --resume's
checkpoint, the testbed's needs (`check_testbed`) and the topology's peer slots (`topology_rates`),
ssh to each remote host (``p2plearn.launch.env``).
"""

from __future__ import annotations

import os
import shlex
import shutil

from ..control.estimator import rates_from_file


class UsageError(Exception):
    """A mistake on the command line; printed as one line, exit code 2."""


def check_command(command: list[str], local: bool) -> None:
    """A missing program or script is reported before anything starts (local peers only)."""
    if not local:
        return
    if shutil.which(command[0]) is None:
        raise UsageError(f"command not found: {command[0]!r}")
    if os.path.basename(command[0]).startswith("python"):
        script = _python_script(command[1:])
        if script is None:
            raise UsageError(f"{shlex.join(command)}: no script (python would read its program from stdin), "
                             f"e.g. -- {command[0]} train.py")
        if script and not os.path.isfile(script):
            raise UsageError(f"script not found: {script!r} (in {os.getcwd()})")


def _python_script(args: list[str]) -> str | None:
    """The script python runs with ``args``: its path, "" for ``-m``/``-c``/``-`` (nothing to check),
    None when there is none (python would read its program from stdin)."""
    words = iter(args)
    for word in words:
        if word in ("-m", "-c", "-") or word.startswith(("-m", "-c")) and not word.startswith("--"):
            return ""
        if word in ("-W", "-X", "--check-hash-based-pycs"):
            next(words, None)  # the option's value
        elif not word.startswith("-"):
            return word
    return None


def topology_rates(path: str) -> dict[int, tuple[float, float]]:
    """Each peer slot's (uplink, downlink) of the topology file at ``path``, which seed the coordinator's view."""
    try:
        return rates_from_file(path)
    except Exception as exc:  # any failure to read it is the user's file or setup: say which
        raise UsageError(f"--topology {path}: {type(exc).__name__}: {exc}") from None


def check_testbed() -> None:
    """--testbed builds network namespaces: it needs root and p2plearn.testbed."""
    if os.geteuid() != 0:
        raise UsageError("--testbed needs root (network namespaces); --emulate does not")
    try:
        import p2plearn.testbed  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"--testbed: p2plearn.testbed is not available ({exc})") from None
