"""Testbed state files: what ``status``, ``exec``, ``measure`` and ``down`` read.

One JSON file per testbed in STATE_DIR (on tmpfs, so a reboot, which also removes every
namespace, clears it). Namespaces are the ground truth for ``down --all``; these files add
what cannot be read back from them: the topology, the subnet and the start time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STATE_DIR = Path("/run/p2plearn-testbed")


def state_path(name: str) -> Path:
    """Where testbed ``name``'s state is kept."""
    return STATE_DIR / f"{name}.json"


def log_path(name: str) -> Path:
    """Where testbed ``name``'s event scheduler writes its log."""
    return STATE_DIR / f"{name}.scheduler.log"


def write_state(name: str, state: dict[str, Any]) -> None:
    """Store ``state`` atomically (a reader never sees half a file)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    temporary = state_path(name).with_suffix(".tmp")
    temporary.write_text(json.dumps(state, indent=1))
    temporary.replace(state_path(name))


def read_state(name: str) -> dict[str, Any] | None:
    """The stored state of testbed ``name``, or None if it has none."""
    try:
        return json.loads(state_path(name).read_text())
    except FileNotFoundError:
        return None


def state_names() -> set[str]:
    """Names of the testbeds that have state files."""
    return {path.stem for path in STATE_DIR.glob("*.json")} if STATE_DIR.is_dir() else set()


def remove_state(name: str) -> None:
    """Delete testbed ``name``'s state file and scheduler log, if any."""
    state_path(name).unlink(missing_ok=True)
    log_path(name).unlink(missing_ok=True)
