"""Finding the job: this peer's rank and size, the job's id and secret, and where its coordinator is.

``p2plearn.runtime`` (``p2plearn.init()``) and ``p2plearn.launch`` (``p2plearn-run``) both use it; it
imports nothing else of p2plearn. One concern per module:

- ``errors``: `SetupError`, the base of every mistake in a job's setup (here, and options and
  checkpoints above), and the hook that reports one as a line with exit code 2 under any launcher;
- ``variables``: the environment variables ``p2plearn-run`` sets and ``init()`` reads;
- ``ranks``: rank, size, local rank and size, and the job id, from any launcher's environment
  (p2plearn-run, torchrun, mpirun, srun);
- ``coordinator``: the host and port at which every rank reaches rank 0's coordinator;
- ``secret``: the job's secret when no launcher of ours made one;
- ``jobfiles``: the private directory the ranks of one job on one host share (key, coordinator address).
"""

from .coordinator import COORDINATOR_PORTS, DiscoveryError, coordinator_host, coordinator_port
from .errors import SetupError, install_excepthook
from .jobfiles import JobFiles, JobFilesError, shared_on_this_host
from .ranks import RankError, detect_job_id, detect_rank, launcher_found
from .secret import JobSecret, SecretError, job_secret

__all__ = ["COORDINATOR_PORTS", "DiscoveryError", "JobFiles", "JobFilesError", "JobSecret", "RankError", "SecretError",
           "SetupError", "coordinator_host", "coordinator_port", "detect_job_id", "detect_rank", "install_excepthook",
           "job_secret", "launcher_found", "shared_on_this_host"]
