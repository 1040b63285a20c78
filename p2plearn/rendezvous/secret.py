"""The job's secret when no launcher of ours made one (mpirun, srun, torchrun, a plain script).

``job_secret`` takes, in order:

1. ``P2PLEARN_JOB_KEY`` when it is set (``p2plearn-run`` always sets it; export it to every rank
   of a job across hosts, e.g. ``mpirun -x P2PLEARN_JOB_KEY``; srun passes the environment). A key
   of fewer than ``MIN_KEY_BYTES`` bytes (hex counts as its bytes: 32 hex digits make 16) is
   refused: one that short can be guessed, and it keys every frame and datagram of the job;
2. a fresh random key for a job of one peer;
3. when every rank runs on this host: the ``key`` file of the job's private directory
   (``p2plearn.rendezvous.jobfiles``). The first rank to arrive creates it with a random 256-bit key,
   atomically; the others read it, so no rank waits for another. The last rank of the job to
   close removes it, whichever rank that is (also after the others were killed);
4. across hosts, mpi4py when it is installed: rank 0 draws the key and broadcasts it;
5. otherwise a one-line error: a job across hosts needs the key set.

Never a key derived from something guessable (the job id is not a secret).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import SetupError
from .jobfiles import JobFiles, JobFilesError
from .variables import KEY_VAR

MIN_KEY_BYTES = 16  # 128 bits: beyond guessing, as a random key of ours (32 bytes) is


class SecretError(SetupError, ValueError):
    """No job key can be had; the message says what to set."""


@dataclass(frozen=True)
class JobSecret:
    """The job's secret (hex)."""

    value: str


def job_secret(environ: Mapping[str, str], rank: int, world_size: int, local_world_size: int,
               files: JobFiles | None = None) -> JobSecret:
    """This job's secret: see the module's docstring for where it comes from. ``files``: the job's
    shared files, needed when several ranks run and all of them on this host."""
    if environ.get(KEY_VAR):
        return JobSecret(_strong(environ[KEY_VAR]))
    if world_size <= 1:
        return JobSecret(secrets.token_hex(32))
    if local_world_size >= world_size:
        if files is None:
            raise ValueError("job_secret: ranks on one host share the key through JobFiles; pass files")
        try:
            return JobSecret(files.key())
        except JobFilesError as exc:
            raise SecretError(str(exc)) from None
    value = _from_mpi(rank)
    if value:
        return JobSecret(value)
    raise SecretError(f"ranks run on several hosts and {KEY_VAR} is not set: set it to the same secret on every "
                      f"rank (e.g. export {KEY_VAR}=$(openssl rand -hex 32); mpirun -x {KEY_VAR} ...), "
                      f"or install mpi4py")


def _strong(key: str) -> str:
    """``key``, or `SecretError` when it has fewer than ``MIN_KEY_BYTES`` bytes (as ``keys.material`` reads it)."""
    try:
        size = len(bytes.fromhex(key))
    except ValueError:
        size = len(key.encode())
    if size < MIN_KEY_BYTES:
        raise SecretError(f"{KEY_VAR} has {size} bytes, fewer than {MIN_KEY_BYTES}: anyone could guess it; set a "
                          f"random one on every rank, e.g. export {KEY_VAR}=$(openssl rand -hex 32)")
    return key


def _from_mpi(rank: int) -> str | None:
    """Rank 0's fresh key, broadcast through MPI (None without mpi4py)."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD.bcast(secrets.token_hex(32) if rank == 0 else None, root=0)
