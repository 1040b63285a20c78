"""Finding a topology file: a path as given, else a topology shipped with p2plearn, by name.

The documented commands say ``--topology topology/heterogeneous-4.json`` (the repository's
``topology/`` folder) or simply ``--topology heterogeneous-4``; both work from any directory: a path
that does not exist relative to the current directory is looked up among the shipped files.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

# The repository's topology files next to the package (a checkout, an editable install as `make demo`
# and the README make); else where a wheel installs them (pyproject.toml's data-files).
_REPOSITORY_DIR = Path(__file__).resolve().parents[2] / "topology"
SHIPPED_DIR = _REPOSITORY_DIR if _REPOSITORY_DIR.is_dir() else Path(sys.prefix) / "share" / "p2plearn" / "topology"


def shipped_names() -> list[str]:
    """The names of the shipped topologies (file stems), sorted; empty if the folder is missing."""
    return sorted(path.stem for path in SHIPPED_DIR.glob("*.json"))


def resolve(path: str | os.PathLike) -> Path:
    """The topology file ``path`` names: itself if it exists; else, for a bare name or a relative
    path in a ``topology/`` folder (``heterogeneous-4``, ``topology/heterogeneous-4.json``), the
    shipped file of that name if there is one; else ``path`` unchanged (opening it says why not)."""
    given = Path(path)
    if given.exists() or given.is_absolute() or given.parent.name not in ("", "topology") \
            or given.parent.parent != Path("."):
        return given
    shipped = SHIPPED_DIR / (given.name if given.suffix == ".json" else f"{given.name}.json")
    return shipped if shipped.is_file() else given


def nearest_shipped(path: str | os.PathLike) -> str:
    """A clause for a missing ``path``'s error line: the shipped topologies nearest its name (all
    of them when none is near), e.g. ``"; nearest shipped topologies: heterogeneous-4, heterogeneous-8"``."""
    names = shipped_names()
    if not names:
        return ""
    stem = Path(path).name.removesuffix(".json")
    nearest = difflib.get_close_matches(stem, names, n=3, cutoff=0.5)
    return f"; nearest shipped topologies: {', '.join(nearest)}" if nearest else \
        f"; shipped topologies: {', '.join(names)}"
