"""``p2plearn.init()``: find this peer's place in the job and connect it to the control plane.

Finding the job is ``p2plearn.rendezvous``'s: rank and size from the first launcher whose variables
are set, and the job id (``rendezvous.ranks``); the coordinator's host and port (``rendezvous.coordinator``);
the job's secret (``rendezvous.secret``); the files the ranks of a job on one host share
(``rendezvous.jobfiles``).

The coordinator is ``P2PLEARN_COORDINATOR`` when set (p2plearn-run started it). Else rank 0
starts it, in a process of its own, at the host and on the port ``p2plearn.rendezvous.coordinator``
finds; with every rank on this host, on a port the OS chooses, which rank 0 publishes in the job's
files for the others.

A port held by anything but this job's coordinator (another job's, a leftover process, another
program) makes rank 0 raise ``PortInUse`` at once, one line that names the port and the fix. A
port taken by this job's own coordinator means rank 0 was restarted: it joins that coordinator.
Should the coordinator's process or its host die, the live peer of lowest rank starts a
successor and the others follow it (see ``p2plearn.control.Client``).

The job's secret (control-plane HMAC and data-plane tags, each under its own derived key) is
``P2PLEARN_JOB_KEY``; without it, the ranks of a job on one host share a key file private to
this user, and mpi4py carries rank 0's key across hosts (``p2plearn.rendezvous.secret``).

Threads: unless the user chose (``OMP_NUM_THREADS``), each rank takes its share of the host's cores
for torch's intra-op threads, as p2plearn-run and torchrun do for theirs; local rank 0 says so in
one line (``p2plearn.threads``).

Mistakes in the setup (an option, a variable, a port, the secret, a checkpoint) raise a
``p2plearn.rendezvous.SetupError``; importing this module installs the hook that reports one uncaught
as one line with exit code 2, under any launcher. Rank 0 also says, once, what is likely a mistake
but not an error: a ``P2PLEARN_*`` variable that nothing reads (with the nearest known name), no
launcher's variables at all (a job of one), a ``p2plearn-run --resume`` the script never loaded.

Under p2plearn-run a peer stops (one line on the launcher's terminal, exit code 129) when its
launcher dies, as mpirun's ranks stop with their daemon.

Registration: ``init()`` registers this peer and waits until all ``world_size`` peers have
(the rendezvous). The data engine is created later by the training API; give its address
either now (``init(engine_address=(host, port))``) or once it exists
(``runtime.register((host, port))``, which updates the registration).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .control import Client, ControlError, Member, Refused
from .control.server import ServerProcess, spawn
from .options import Options, unknown_variables
from .protocols import ControlClient
from .rank_output import tag_under_mpirun
from .rendezvous.errors import SetupError
from .rendezvous.coordinator import coordinator_host, coordinator_port
from .rendezvous.jobfiles import JobFiles, shared_on_this_host
from .rendezvous.ranks import detect_job_id, detect_rank, launcher_found
from .rendezvous.secret import JobSecret, job_secret
from .rendezvous.variables import (COORDINATOR_VAR, ENGINE_HOST_VAR, KEY_VAR, LAUNCHER_FD_VAR, LAUNCHER_PID_VAR,
                                   RESUME_VAR)
from .threads import fit_threads, oversubscription

__all__ = ["PortInUse", "Runtime", "init", "oversubscription"]

log = logging.getLogger("p2plearn")

PROBE_S = 5.0  # a live coordinator of this job on a taken port answers well within this, even on a busy host
LAUNCHER_GONE = 129  # a peer's exit code when its launcher died (as on a hang-up)
LAUNCHER_POLL_S = 0.5


class PortInUse(ControlError, SetupError):
    """The coordinator's port is held by something other than this job's coordinator; the message
    names the port, what holds it, and how to choose another."""


@dataclass
class Runtime:
    """This peer's place in the job and its control-plane client.

    ``coordinator`` is set on the rank that started the coordinator's process (rank 0 without a
    launcher); the process outlives a crash of that rank, and the others fail over if it dies.
    ``files``: this rank's hold on the files the job's ranks share on this host (key, port).
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
    files: JobFiles | None = None
    resume: str | None = None  # p2plearn-run --resume's directory (P2PLEARN_RESUME), for close() to check
    resumed_step: int | None = None  # set by p2plearn.checkpoint.load when this peer restored a checkpoint
    # p2plearn.checkpoint's: (directory, step) of this rank's last save, where closing marks a job's end;
    # and whether load said there was nothing left to train (closing then does not say it again)
    saved: tuple[str, int] | None = None
    said_nothing_left: bool = False

    def engine_host(self) -> str:
        """Where this peer's engine listens: the launcher's choice (testbed namespaces), loopback when
        the coordinator is on loopback or a unix socket (a job on one machine), else the address this
        host uses towards the coordinator (host names say nothing: containers and namespaces share them)."""
        if os.environ.get(ENGINE_HOST_VAR):
            return os.environ[ENGINE_HOST_VAR]
        address = self.client.address
        coordinator_host = address.rsplit(":", 1)[0].split("//")[-1]
        if not address.startswith("tcp://") or coordinator_host in ("127.0.0.1", "localhost", "::1"):
            return "127.0.0.1"
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect((coordinator_host, 9))
            return probe.getsockname()[0]
        finally:
            probe.close()

    def register(self, engine_address: tuple[str, int] | None) -> dict[int, Member]:
        """Publish (or change) the address of this peer's data engine; returns the members."""
        return self.client.register(engine_address)

    def close(self, leave: bool = True, linger: float = 10.0) -> None:
        """Deregister (unless ``leave`` is False) and stop the client.

        The rank that started the coordinator first waits up to ``linger`` seconds for the others
        to leave or be declared dead, so that a peer finishing a moment later still finds it.
        """
        if self.resume and self.resumed_step is None and self.rank == 0:
            log.warning(f"p2plearn: p2plearn-run --resume {self.resume}: this script never called "
                        f"p2plearn.checkpoint.load(None, ...), so it trained from scratch")
        try:
            if leave:
                self.client.leave()
        except ControlError:
            pass  # the job is over; a coordinator that went first has nothing to be told
        finally:
            if self.coordinator is not None:
                self.client.wait_alone(linger)  # before close(): a closed client's membership is stale
            self.client.close()
            if self.coordinator is not None:
                self.coordinator.stop()  # ends the job: the clients are told, none starts a successor
            if self.files is not None:
                self.files.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(leave=exc[0] is None)


_jobs_started = 0  # init() calls of this process whose ranks found each other themselves


def init(engine_address: tuple[str, int] | None = None, *, join: bool = False, timeout: float = 60.0,
         environ: Mapping[str, str] | None = None, **overrides: Any) -> Runtime:
    """Connect this peer to its job and return the Runtime.

    - ``engine_address``: where this peer's data engine listens (or call ``register`` later).
    - ``join``: join a running job; the client's ``donor`` will send the model state.
    - ``timeout``: seconds to wait for the coordinator and for every peer to register; raise it
      when peers start slowly (large imports, many hosts).
    - ``environ``: read instead of ``os.environ`` (tests).
    - ``overrides``: option values that win over ``P2PLEARN_*`` (e.g. ``sync="ssp"``).

    The coordinator's port: one the OS chooses when every rank is on this host, else
    ``MASTER_PORT + 1`` when ``MASTER_PORT`` is set, else one derived from the job id (see
    ``p2plearn.rendezvous.coordinator``). Raises ``PortInUse`` (one line, at once) when something else holds that port.

    Called again in the same processes (every rank, after closing the last Runtime), where the ranks
    find each other themselves (no launcher's coordinator), it starts a job of its own: the job id
    gets the call's number (``.1``, ``.2``, ...), so the last job's published coordinator, files and
    key are not taken for this one's.
    """
    env = os.environ if environ is None else environ
    rank, world_size, local_rank, local_world_size = detect_rank(env)
    if environ is None:
        tag_under_mpirun(env, rank)  # whole lines tagged "[rank] ", as p2plearn-run shows them
    _watch_launcher(env, rank)  # from the start: a launcher may die while this peer waits for the others
    options = Options.from_env(env, **overrides)
    if rank == 0:
        _notices(env)
    job_id = detect_job_id(env)
    if not join and not env.get(COORDINATOR_VAR):  # (a launcher's coordinator serves one job: rejoin it)
        global _jobs_started
        if _jobs_started:
            job_id = f"{job_id}.{_jobs_started}"
        _jobs_started += 1
    threads = fit_threads(env, local_world_size)
    if threads and local_rank == 0:
        _say_once(threads)
    files = JobFiles(env, job_id) if shared_on_this_host(env, world_size, local_world_size) else None
    runtime = None
    try:
        secret = job_secret(env, rank, world_size, local_world_size, files)
        client, coordinator = _connect(env, rank, world_size, local_world_size, job_id, secret.value, options,
                                       join, timeout, files)
        runtime = Runtime(rank=rank, world_size=world_size, local_rank=local_rank, local_world_size=local_world_size,
                          options=options, job_id=job_id, client=client, coordinator=coordinator, secret=secret,
                          files=files, resume=env.get(RESUME_VAR) or None)
        client.register(engine_address, join=join)
        runtime.rank = client.rank
        if not join:
            client.wait_members(world_size, timeout)
    except BaseException:
        if runtime is not None:
            runtime.close(leave=False)
        elif files is not None:
            files.close()
        raise
    return runtime


def _connect(env: Mapping[str, str], rank: int, world_size: int, local_world_size: int, job_id: str, key: str,
             options: Options, join: bool, timeout: float,
             files: JobFiles | None) -> tuple[Client, ServerProcess | None]:
    """This peer's client, and the coordinator's process when this rank started it."""
    address = env.get(COORDINATOR_VAR)
    joining = join or rank != 0
    if address:
        return Client(address, job_id, key, rank=None if join else rank, connect_timeout=timeout), None
    host = coordinator_host(env, rank, world_size, local_world_size)
    # Ranks on one host: rank 0 publishes the port. A job of one peer: nobody else looks for its coordinator.
    port = None if files is not None else coordinator_port(env, job_id, os_chooses=world_size == 1)

    def start(bind_port: int) -> ServerProcess:
        return spawn(job_id, key, bind=f"tcp://0.0.0.0:{bind_port}", advertise=host, world_size=world_size,
                     heartbeat=options.heartbeat, phi_threshold=options.phi_threshold, topology=options.topology,
                     dashboard=options.dashboard, log_dir=options.log_dir, timeout=timeout)

    coordinator = None
    if port is None:
        if files is not None and joining:
            address = files.wait_address(timeout)
        else:
            # A restarted rank 0 finds its job's coordinator (or the successor serving on its endpoint) published.
            address = files.address() if files is not None else None
            if address is None:
                coordinator = start(0)
                address = coordinator.address
                if files is not None:
                    files.publish_address(address)
    else:
        address = f"{host}:{port}"
        if not joining:
            if _port_taken(port):
                # This job's coordinator (a successor serving on its predecessor's endpoint: rank 0 was
                # restarted) answers at once; anything else is named here, not after a 60 s wait.
                return _client(address, port, job_id, key, None if join else rank, PROBE_S, probing=True), None
            try:
                coordinator = start(port)
            except RuntimeError:
                if _port_taken(port):  # taken between the check and the bind
                    raise _port_in_use(port, "another program") from None
                raise
    try:
        return _client(address, port, job_id, key, None if join else rank, timeout), coordinator
    except BaseException:
        if coordinator is not None:
            coordinator.stop()
        raise


def _client(address: str, port: int | None, job_id: str, key: str, rank: int | None, connect_timeout: float,
            probing: bool = False) -> Client:
    """A client of the coordinator at ``address``. On a fixed ``port`` a refusal names its holder,
    and so does silence when ``probing`` (rank 0 found the port taken: whatever holds it is up)."""
    try:
        return Client(address, job_id, key, rank=rank, connect_timeout=connect_timeout)
    except Refused:
        if port is None:
            raise
        if probing:
            raise _port_in_use(port, "another job's coordinator") from None
        raise PortInUse(f"the coordinator at {address} refused this rank's job key: another job's coordinator holds "
                        f"port {port} (set MASTER_PORT to a free port P on every rank; the coordinator takes P + 1), "
                        f"or this rank's {KEY_VAR} or job id differs from rank 0's") from None
    except ControlError:
        if not probing:
            raise
        raise _port_in_use(port, "a program that is not a p2plearn coordinator (it does not answer)") from None


def _port_in_use(port: int | None, holder: str) -> PortInUse:
    return PortInUse(f"the coordinator's port {port} on this host is held by {holder}: free it, or set MASTER_PORT "
                     f"to a free port P on every rank (the coordinator takes P + 1)")


def _port_taken(port: int) -> bool:
    """Whether something on this host listens on TCP ``port`` already."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds: TIME_WAIT is free
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def _notices(env: Mapping[str, str]) -> None:
    """Rank 0's lines on what is likely a mistake but not an error (see the module's docstring)."""
    if not env.get(LAUNCHER_PID_VAR):  # p2plearn-run said these itself, once for the job
        for line in unknown_variables(env):
            _say_once(line)
    if not launcher_found(env):
        _say_once("p2plearn: no launcher's variables found (p2plearn-run, torchrun, mpirun, srun): this process "
                  "trains alone, as rank 0 of 1")


@functools.cache
def _say_once(line: str) -> None:
    """Log ``line`` the first time only: a process may call ``init()`` more than once (tests, restarts)."""
    log.warning(line)


def _watch_launcher(env: Mapping[str, str], rank: int) -> None:
    """Under p2plearn-run, stop this peer with one line when its launcher dies."""
    if not env.get(LAUNCHER_PID_VAR):
        return
    pid = int(env[LAUNCHER_PID_VAR])
    started = _start_time(pid)

    def watch() -> None:
        while started is not None and _start_time(pid) == started:  # the same process, alive
            time.sleep(LAUNCHER_POLL_S)
        line = f"p2plearn: rank {rank}: its launcher (p2plearn-run, pid {pid}) died; stopping\n".encode()
        # The launcher's own stderr (the user's terminal): the pipe it read ours from has no reader now.
        for fd in (int(env[LAUNCHER_FD_VAR]) if env.get(LAUNCHER_FD_VAR) else 2, 2):
            try:
                os.write(fd, line)
                break
            except OSError:
                continue
        os._exit(LAUNCHER_GONE)

    threading.Thread(target=watch, name="p2plearn-launcher-watch", daemon=True).start()


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), None if it is gone or a zombie: a
    process that died and whose number was reused has another start time."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in "ZX" else int(fields[19])
