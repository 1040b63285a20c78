"""Issue 44 under a real srun (a one-node Slurm cluster of this machine, tests/slurm_cluster.py): a
mistake in the setup is one line per rank and exit code 2, as under the other launchers (srun's
variables set by hand were all that was tested before). The README's srun line: tests/test_readme.py."""

import os
import shutil
import subprocess
import sys

import pytest

from slurm_cluster import one_node_cluster, why_not

from launch_helpers import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.skipif(why_not() is not None, reason=str(why_not()))]
SCRIPT = "import p2plearn\nrt = p2plearn.init(timeout=30)\nprint('rank', rt.rank, 'ran')\nrt.close(linger=0)\n"


def test_an_option_error_under_srun_is_one_line_per_rank_and_exit_code_2(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("P2PLEARN_", "MASTER_", "SLURM_"))}
    with one_node_cluster(tmp_path / "slurm") as cluster:
        done = subprocess.run([shutil.which("srun"), "-N", "1", "-n", "2", sys.executable, "train.py"], cwd=tmp_path,
                              env={**env, **cluster, "PYTHONPATH": ROOT, "P2PLEARN_SYNC": "bogus"},
                              capture_output=True, text=True, timeout=120)
    line = "p2plearn: error: --sync: must be one of bsp, ssp, partitioned (got 'bogus' from P2PLEARN_SYNC)"
    assert done.returncode == 2, done.stderr
    ours = [text for text in done.stderr.splitlines() if not text.startswith("srun: ")]
    assert ours == [line, line] and done.stdout == "", done.stderr  # each rank's one line, nothing else of ours
    assert "Traceback" not in done.stderr
