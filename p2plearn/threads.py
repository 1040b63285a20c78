"""The torch intra-op threads of the ranks on one host: shared out in-process when nobody chose them.

torch gives every process as many intra-op threads as the host has cores, so N ranks on one host
run N times more threads than cores, and each step takes several times longer (4 ranks on 2 cores:
4.7x). p2plearn-run and torchrun set ``OMP_NUM_THREADS`` for their ranks; under mpirun, srun or a
launch by hand ``p2plearn.init()`` does the same in-process (`fit_threads`): each rank takes the
host's cores / its local ranks (at least 1), and local rank 0 says so in one line.

The user's choice wins: with ``OMP_NUM_THREADS`` set, or fewer threads already set than the share
(``torch.set_num_threads`` before ``init()``), nothing changes; local rank 0 only warns when the
ranks' threads outnumber the cores (`oversubscription`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

THREADS_VAR = "OMP_NUM_THREADS"


def oversubscription(threads: int, local_ranks: int, cores: int) -> str | None:
    """The warning for ``local_ranks`` ranks of ``threads`` intra-op threads each on ``cores``
    cores, or None when they fit (or each rank has one thread already: then the ranks alone
    outnumber the cores, which fewer threads cannot fix)."""
    if threads <= 1 or threads * local_ranks <= cores:
        return None
    share = max(1, cores // local_ranks)
    return (f"p2plearn: {local_ranks} ranks on this host run {threads} torch threads each on {cores} cores: set "
            f"OMP_NUM_THREADS={share} for every rank (p2plearn-run does), or torch.set_num_threads({share})")


def fit_threads(environ: Mapping[str, str], local_ranks: int) -> str | None:
    """Give this rank its share of the host's cores unless the user chose (see the module's
    docstring); returns the line for local rank 0 to say, or None when there is nothing to say.
    ``environ``: the job's variables (``OMP_NUM_THREADS`` there or in this process's counts as chosen).
    Without torch imported yet, ``OMP_NUM_THREADS`` is set in this process, for torch to read when it loads."""
    cores = len(os.sched_getaffinity(0))
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else cores  # torch's default: every core
    if THREADS_VAR in environ or THREADS_VAR in os.environ:
        return oversubscription(threads, local_ranks, cores) if torch is not None else None
    share = max(1, cores // local_ranks)
    if threads <= share:
        return None
    if torch is not None:
        torch.set_num_threads(share)
    else:
        os.environ[THREADS_VAR] = str(share)
    return (f"p2plearn: {local_ranks} ranks share this host's {cores} cores: each runs {share} torch "
            f"thread{'s' if share > 1 else ''} (torch.set_num_threads({share})); set {THREADS_VAR} to choose")
