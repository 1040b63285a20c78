"""This peer's place in the job, from its launcher's environment: rank, size, local rank and size, job id.

Rank and size come from the first launcher whose variables are set:

1. ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` (p2plearn-run, torchrun)
2. ``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` / ``_LOCAL_RANK`` / ``_LOCAL_SIZE`` (Open MPI)
3. ``PMI_RANK`` / ``PMI_SIZE`` (MPICH, Intel MPI; ``MPI_LOCALRANKID`` when set)
4. ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID`` (srun)

otherwise a single peer (rank 0 of 1): ``launcher_found`` tells the two apart. A variable that is
not an integer, or a rank outside the size, raises `RankError`. The job id is the first of ``P2PLEARN_JOB_ID``,
``TORCHELASTIC_RUN_ID``, ``OMPI_MCA_ess_base_jobid``, ``PMIX_NAMESPACE``, ``SLURM_JOB_ID`` that is
set (else ``local``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .errors import SetupError
from .variables import JOB_ID_VAR

# (rank, size, local rank, local size) variables of each launcher, in order of precedence.
_LAUNCHERS = [
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE"),
]
# Job identifiers that every rank of one launch shares, when the launcher set no P2PLEARN_JOB_ID.
_JOB_IDS = [JOB_ID_VAR, "TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID"]


class RankError(SetupError, ValueError):
    """A launcher's rank or size variable that cannot be read; the message names it."""


def launcher_found(environ: Mapping[str, str]) -> bool:
    """Whether any launcher's rank and size variables are set (else this process runs alone)."""
    return any(environ.get(rank_var) and environ.get(size_var) for rank_var, size_var, _, _ in _LAUNCHERS)


def detect_rank(environ: Mapping[str, str]) -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) from the first launcher's variables."""
    for rank_var, size_var, local_var, local_size_var in _LAUNCHERS:
        if environ.get(rank_var) and environ.get(size_var):
            rank, size = _int(environ, rank_var), _int(environ, size_var)
            local = _int(environ, local_var) if environ.get(local_var) else rank
            # SLURM_TASKS_PER_NODE looks like "4(x2),3": the first number is this layout's width.
            match = re.match(r"\d+", environ.get(local_size_var, ""))
            local_size = int(match.group()) if match else size
            if not 0 <= rank < size:
                raise RankError(f"{rank_var}={rank} is not in [0, {size_var}={size})")
            return rank, size, local, local_size
    return 0, 1, 0, 1


def detect_job_id(environ: Mapping[str, str]) -> str:
    """The job's id, the same on every rank of one launch: the first of the launchers' ids that is set."""
    return next((environ[k] for k in _JOB_IDS if environ.get(k)), "local")


def _int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise RankError(f"{name}={environ[name]!r} is not an integer") from None
