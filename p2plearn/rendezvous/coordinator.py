"""Where the ranks reach rank 0's coordinator when no launcher of ours started the job (mpirun, srun, torchrun).

The host: ``coordinator_host`` tries, in order: ``P2PLEARN_COORDINATOR_HOST``; ``MASTER_ADDR`` (torchrun,
and what users of other launchers often export); the first node of Slurm's node list; 127.0.0.1 when
every rank runs on this host (the launcher's local size equals the world size); mpi4py, when it
is installed, to have rank 0 tell the others its address. Open MPI sets no ``MASTER_ADDR``, so a
job across hosts without mpi4py or one of the variables gets a one-line error naming what to set,
rather than every rank looking for the coordinator at 127.0.0.1.

The port, by this rule:

- every rank on this host (unless both ``P2PLEARN_JOB_KEY`` and ``MASTER_PORT`` are set): a free
  port the OS chooses; rank 0 publishes it in the job's private directory and the other ranks read
  it there (``p2plearn.rendezvous.jobfiles``), so two jobs on one host never collide. ``MASTER_PORT + 1``
  is not used here: torchrun picks ``MASTER_PORT`` among the ephemeral ports, where the next one may
  be any program's;
- ``MASTER_PORT`` set: ``MASTER_PORT + 1`` (torchrun's own store owns ``MASTER_PORT``);
- a job of one peer: a free port the OS chooses;
- across hosts: a port derived from the job id, in ``COORDINATOR_PORTS`` (30000-32767). Two jobs
  sharing a host collide only when their ids map to one port (1 in 2,768); set ``MASTER_PORT``.

``coordinator_port`` gives the last three; in the first, ``JobFiles`` carries the port from rank 0
(``p2plearn.runtime`` publishes and reads it) and ``jobfiles.shared_on_this_host`` says when that is.
"""

from __future__ import annotations

import hashlib
import re
import socket
from collections.abc import Mapping

from .errors import SetupError
from .variables import COORDINATOR_HOST_VAR

SLURM_NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
# Ports derived from the job id when the ranks span hosts and MASTER_PORT is not set: below
# Linux's ephemeral range (32768-60999), where outgoing connections could hold one.
COORDINATOR_PORTS = range(30000, 32768)


class DiscoveryError(SetupError, ValueError):
    """Rank 0's address or port cannot be found; the message says which variable to set."""


def coordinator_host(environ: Mapping[str, str], rank: int, world_size: int, local_world_size: int) -> str:
    """The address at which every rank reaches rank 0's host."""
    for var in (COORDINATOR_HOST_VAR, "MASTER_ADDR"):
        if environ.get(var):
            return environ[var]
    for var in SLURM_NODELISTS:
        if environ.get(var):
            return first_slurm_node(environ[var])
    if local_world_size >= world_size:
        return "127.0.0.1"
    host = _from_mpi(rank)
    if host:
        return host
    raise DiscoveryError("ranks run on several hosts and rank 0's address is unknown: set "
                         "P2PLEARN_COORDINATOR_HOST (or MASTER_ADDR) to an address of rank 0's host that every "
                         "host can reach, or install mpi4py")


def coordinator_port(env: Mapping[str, str], job_id: str, os_chooses: bool) -> int | None:
    """The coordinator's port, for ranks that do not share a host's job files (see the module's
    docstring): ``MASTER_PORT + 1``, else None when ``os_chooses`` (a job of one peer), else a port
    in ``COORDINATOR_PORTS`` derived from ``job_id``."""
    if env.get("MASTER_PORT"):
        try:
            return int(env["MASTER_PORT"]) + 1
        except ValueError:
            raise DiscoveryError(f"MASTER_PORT={env['MASTER_PORT']!r} is not an integer") from None
    if os_chooses:
        return None
    digest = int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "big")
    return COORDINATOR_PORTS[digest % len(COORDINATOR_PORTS)]


def first_slurm_node(nodelist: str) -> str:
    """``node[03-05,9],gpu1`` -> ``node03``: the first host of a Slurm node list."""
    match = re.match(r"([^,\[]+)(?:\[([^],-]+))?", nodelist.strip())
    if not match:
        raise DiscoveryError(f"cannot read a host from the Slurm node list {nodelist!r}: set P2PLEARN_COORDINATOR_HOST")
    return match.group(1) + (match.group(2) or "")


def _from_mpi(rank: int) -> str | None:
    """Rank 0's outward address, broadcast through MPI (None without mpi4py)."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    address = outward_address() if rank == 0 else None
    return MPI.COMM_WORLD.bcast(address, root=0)


def outward_address() -> str:
    """The address this host uses towards other hosts (the source of a route off the machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks a route, sends nothing
            return probe.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())
