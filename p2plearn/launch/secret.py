"""The job's secret when no launcher of ours made one (mpirun, srun, torchrun, a plain script).

``job_secret`` takes, in order:

1. ``P2PLEARN_JOB_KEY`` when it is set (``p2plearn-run`` always sets it; export it to every rank
   of a job across hosts, e.g. ``mpirun -x P2PLEARN_JOB_KEY``; srun passes the environment);
2. a fresh random key for a job of one peer;
3. when every rank runs on this host: a key file in a directory only this user can open
   (``$XDG_RUNTIME_DIR/p2plearn`` or ``/tmp/p2plearn-<uid>``, mode 0700; the file 0600), named by
   the job id and ``MASTER_ADDR``/``MASTER_PORT``. The first rank to arrive creates it with a
   random 256-bit key, atomically; the others read it, so no rank waits for another. The rank that
   created it removes it when it closes;
4. across hosts, mpi4py when it is installed: rank 0 draws the key and broadcasts it;
5. otherwise a one-line error: a job across hosts needs the key set.

Never a key derived from something guessable (the job id is not a secret).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .env import KEY_VAR

class SecretError(ValueError):
    """No job key can be had; the message says what to set."""


@dataclass(frozen=True)
class JobSecret:
    """The secret (hex) and, for the rank that created it, the key file to remove at the end."""

    value: str
    created: Path | None = None

    def discard(self) -> None:
        """Remove the key file this rank created (the job is over)."""
        if self.created is not None:
            self.created.unlink(missing_ok=True)


def job_secret(environ: Mapping[str, str], job_id: str, rank: int, world_size: int,
               local_world_size: int) -> JobSecret:
    """This job's secret: see the module's docstring for where it comes from."""
    if environ.get(KEY_VAR):
        return JobSecret(environ[KEY_VAR])
    if world_size <= 1:
        return JobSecret(secrets.token_hex(32))
    if local_world_size >= world_size:
        return _shared_file(_key_dir(environ), environ, job_id)
    value = _from_mpi(rank)
    if value:
        return JobSecret(value)
    raise SecretError(f"ranks run on several hosts and {KEY_VAR} is not set: set it to the same secret on every "
                      f"rank (e.g. export {KEY_VAR}=$(openssl rand -hex 32); mpirun -x {KEY_VAR} ...), "
                      f"or install mpi4py")


def _key_dir(environ: Mapping[str, str]) -> Path:
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "p2plearn"
    return Path(tempfile.gettempdir()) / f"p2plearn-{os.getuid()}"


def _shared_file(directory: Path, environ: Mapping[str, str], job_id: str) -> JobSecret:
    """Create the job's key file, or read it when another rank of the job was first."""
    directory.mkdir(mode=0o700, exist_ok=True)
    info = directory.lstat()
    # In a shared /tmp someone else may have made the directory first, to read our keys.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise SecretError(f"{directory} is not a directory that only this user can open: remove it, or set {KEY_VAR}")
    name = hashlib.sha256(f"{job_id}|{environ.get('MASTER_ADDR', '')}|{environ.get('MASTER_PORT', '')}".encode())
    path = directory / f"{name.hexdigest()[:32]}.key"
    value = secrets.token_hex(32)
    draft = directory / f".{path.name}.{os.getpid()}"
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
    try:
        os.link(draft, path)  # atomic, and fails when another rank was first: then its key is the job's
        created: Path | None = path
    except FileExistsError:
        created = None
    finally:
        draft.unlink()
    if created is not None:
        return JobSecret(value, created)
    value = path.read_text().strip()
    if len(value) != 64:
        raise SecretError(f"{path} does not hold a key: remove it, or set {KEY_VAR}")
    return JobSecret(value)


def _from_mpi(rank: int) -> str | None:
    """Rank 0's fresh key, broadcast through MPI (None without mpi4py)."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD.bcast(secrets.token_hex(32) if rank == 0 else None, root=0)
