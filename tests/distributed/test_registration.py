"""torch finds the ``p2plearn`` backend whatever the import order, through the ``torch.backends``
entry point pyproject.toml declares (here installed as ``pip install`` would, into a fresh
directory), and programs that never import torch (the launcher) do not import it for p2plearn."""
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from tests.distributed.job import free_port

ROOT = Path(__file__).resolve().parents[2]


def installed(tmp_path: Path) -> Path:
    """A directory holding p2plearn's metadata as an install writes it (its entry points from
    pyproject.toml), so that ``importlib.metadata`` finds them ahead of any other install's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    info = tmp_path / "site" / f"p2plearn-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: p2plearn\nVersion: {project['version']}\n")
    groups = project.get("entry-points", {})
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items()) + "\n"
        for group, points in groups.items()))
    return info.parent


def python(code: str, site: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
                               "OMP_NUM_THREADS": "1", **env})


def test_importing_torch_registers_the_backend_without_importing_it(tmp_path):
    done = python("""
        import sys
        import p2plearn   # before torch: it cannot register the backend itself
        import torch.distributed as dist
        assert "P2PLEARN" in dist.Backend._plugins, dist.Backend._plugins
        # what torch imports at its start is the registration, not the backend (numpy, the engine)
        assert "p2plearn.distributed.backend" not in sys.modules and "p2plearn.runtime" not in sys.modules
        print("ok")
    """, installed(tmp_path))
    assert done.stdout.strip() == "ok", done.stderr


def test_the_launcher_does_not_import_torch(tmp_path):
    done = python("""
        import sys
        import p2plearn, p2plearn.launch.run
        p2plearn.init, p2plearn.Options  # (imported at first use)
        print(sorted(m for m in sys.modules if m.split(".")[0] == "torch"))
    """, installed(tmp_path))
    assert done.stdout.strip() == "[]", done.stderr


@pytest.mark.slow  # a job of one rank: torch, the coordinator's process, the engine
@pytest.mark.parametrize("imports", ["import p2plearn, torch", "import torch", "import torch, p2plearn"])
def test_init_process_group_works_whatever_the_import_order(tmp_path, imports):
    done = python(f"""
        {imports}
        import torch.distributed as dist
        dist.init_process_group("p2plearn", rank=0, world_size=1)
        t = torch.ones(3)
        dist.all_reduce(t)
        print(dist.get_backend(), t.tolist())
        dist.destroy_process_group()
    """, installed(tmp_path), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), P2PLEARN_JOB_ID="registration",
        P2PLEARN_JOB_KEY="0" * 32)
    assert done.stdout.strip() == "p2plearn [1.0, 1.0, 1.0]", done.stderr
