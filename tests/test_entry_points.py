"""``python -m p2plearn`` lists the entry points, and each one it lists exists."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from p2plearn.__main__ import ENTRY_POINTS

ROOT = Path(__file__).resolve().parent.parent


def test_python_m_p2plearn_prints_the_entry_points():
    done = subprocess.run([sys.executable, "-m", "p2plearn"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    table = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    scripts = re.findall(r"^([\w-]+) =", table, re.M)  # (tomllib is Python 3.11+)
    assert scripts
    for script in scripts:
        assert f"  {script} " in done.stdout, done.stdout
    assert "python -m p2plearn.examples.mnist1d" in done.stdout


def test_every_listed_module_runs_as_a_module():
    modules = [command.split()[2] for command, _ in ENTRY_POINTS if command.startswith("python -m ")]
    assert modules
    for name in modules:
        spec = importlib.util.find_spec(name)
        assert spec is not None, name
        if spec.submodule_search_locations:  # a package: it needs a __main__
            assert importlib.util.find_spec(f"{name}.__main__") is not None, name
