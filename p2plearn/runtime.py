"""``p2plearn.init()``: find this peer's place in the job and connect it to the control plane.

Rank and size come from the first launcher whose variables are set:

1. ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` (p2plearn-run, torchrun)
2. ``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` / ``_LOCAL_RANK`` / ``_LOCAL_SIZE`` (Open MPI)
3. ``PMI_RANK`` / ``PMI_SIZE`` (MPICH, Intel MPI; ``MPI_LOCALRANKID`` when set)
4. ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID`` (srun)

otherwise a single peer (rank 0 of 1). The coordinator is ``P2PLEARN_COORDINATOR`` when set (the
launcher started it); else rank 0 starts it, in a process of its own, on ``MASTER_PORT + 1``
(torchrun's own store owns ``MASTER_PORT``) or on ``DEFAULT_PORT``, at the address
``p2plearn.launch.discover.coordinator_host`` finds (``P2PLEARN_COORDINATOR_HOST``,
``MASTER_ADDR``, the first Slurm node, 127.0.0.1 when every rank is on this host, or mpi4py), and
the other ranks connect there. Should that process or its host die, the live peer of lowest rank
starts a successor and the others follow it (see ``p2plearn.control.Client``).

The job's secret (control-plane HMAC and data-plane tags, each under its own derived key) is
``P2PLEARN_JOB_KEY``; without it, a key file private to this user is shared by the ranks of a
job on one host, and mpi4py carries rank 0's key across hosts (``p2plearn.launch.secret``).

Registration: ``init()`` registers this peer and waits until all ``world_size`` peers have
(the rendezvous). The data engine is created later by the training API; give its address
either now (``init(engine_address=(host, port))``) or once it exists
(``runtime.register((host, port))``, which updates the registration).
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .control import Client, ControlError, Member
from .control.server import ServerProcess, spawn
from .launch.secret import JobSecret, job_secret
from .options import Options
from .protocols import ControlClient

DEFAULT_PORT = 29450

# (rank, size, local rank, local size) variables of each launcher, in order of precedence.
_LAUNCHERS = [
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE"),
]
# Job identifiers that every rank of one launch shares, when the launcher set no P2PLEARN_JOB_ID.
_JOB_IDS = ["P2PLEARN_JOB_ID", "TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID"]


@dataclass
class Runtime:
    """This peer's place in the job and its control-plane client.

    ``coordinator`` is set on the rank that started the coordinator's process (rank 0 without a
    launcher); the process outlives a crash of that rank, and the others fail over if it dies.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    options: Options
    job_id: str
    client: ControlClient
    coordinator: ServerProcess | None = None
    secret: JobSecret | None = None  # None: data-plane tags off (in-process tests)

    def register(self, engine_address: tuple[str, int] | None) -> dict[int, Member]:
        """Publish (or change) the address of this peer's data engine; returns the members."""
        return self.client.register(engine_address)

    def close(self, leave: bool = True, linger: float = 10.0) -> None:
        """Deregister (unless ``leave`` is False) and stop the client.

        The rank that started the coordinator first waits up to ``linger`` seconds for the others
        to leave or be declared dead, so that a peer finishing a moment later still finds it.
        """
        try:
            if leave:
                self.client.leave()
        except ControlError:
            pass  # the job is over; a coordinator that went first has nothing to be told
        finally:
            self.client.close()
            if self.coordinator is not None:
                deadline = time.monotonic() + linger
                while self._others_remain() and time.monotonic() < deadline:
                    time.sleep(0.05)
                self.coordinator.stop()
            if self.secret is not None:
                self.secret.discard()

    def _others_remain(self) -> bool:
        try:
            return bool(self.client.members) and self.client.following
        except ControlError:
            return False

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(leave=exc[0] is None)


def init(engine_address: tuple[str, int] | None = None, *, join: bool = False, timeout: float = 60.0,
         environ: Mapping[str, str] | None = None, **overrides: Any) -> Runtime:
    """Connect this peer to its job and return the Runtime.

    - ``engine_address``: where this peer's data engine listens (or call ``register`` later).
    - ``join``: join a running job; the client's ``donor`` will send the model state.
    - ``timeout``: seconds to wait for the coordinator and for every peer to register; raise it
      when peers start slowly (large imports, many hosts).
    - ``environ``: read instead of ``os.environ`` (tests).
    - ``overrides``: option values that win over ``P2PLEARN_*`` (e.g. ``sync="ssp"``).
    """
    env = os.environ if environ is None else environ
    rank, world_size, local_rank, local_world_size = detect_rank(env)
    options = Options.from_env(env, **overrides)
    job_id = next((env[k] for k in _JOB_IDS if env.get(k)), "local")
    secret = job_secret(env, job_id, rank, world_size, local_world_size)
    key = secret.value
    address = env.get("P2PLEARN_COORDINATOR")
    coordinator = None
    if not address:
        from .launch.discover import coordinator_host

        host = coordinator_host(env, rank, world_size, local_world_size)
        port = int(env["MASTER_PORT"]) + 1 if env.get("MASTER_PORT") else DEFAULT_PORT
        address = f"{host}:{port}"
        # A restarted rank 0 finds the port taken by the successor that replaced its coordinator
        # (it serves on its predecessor's endpoint): it joins that one instead of starting another.
        if rank == 0 and not join and not _port_taken(port):
            coordinator = spawn(job_id, key, bind=f"tcp://0.0.0.0:{port}", advertise=host, world_size=world_size,
                                heartbeat=options.heartbeat, phi_threshold=options.phi_threshold,
                                topology=options.topology, timeout=timeout)
    try:
        client = Client(address, job_id, key, rank=None if join else rank, connect_timeout=timeout)
    except BaseException:
        if coordinator is not None:
            coordinator.stop()
        raise
    runtime = Runtime(rank=rank, world_size=world_size, local_rank=local_rank, local_world_size=local_world_size,
                      options=options, job_id=job_id, client=client, coordinator=coordinator, secret=secret)
    try:
        client.register(engine_address, join=join)
        runtime.rank = client.rank
        if not join:
            client.wait_members(world_size, timeout)
    except BaseException:
        runtime.close(leave=False)
        raise
    return runtime


def _port_taken(port: int) -> bool:
    """Whether something on this host listens on TCP ``port`` already."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds: TIME_WAIT is free
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


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
                raise ValueError(f"{rank_var}={rank} is not in [0, {size_var}={size})")
            return rank, size, local, local_size
    return 0, 1, 0, 1


def _int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise ValueError(f"{name}={environ[name]!r} is not an integer") from None
