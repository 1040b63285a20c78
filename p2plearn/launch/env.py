"""What each peer is started with: its environment, and the ssh command line for a remote host.

The job key never appears on a command line (``ps`` shows those to every user): a local peer
gets it in its environment; a remote peer's shell reads it from ssh's stdin.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from ..options import Options
from ..rendezvous.variables import COORDINATOR_VAR, JOB_ID_VAR, KEY_VAR
from .hosts import Host, HostError, Slot

THREADS_VAR = "OMP_NUM_THREADS"
# BatchMode: fail instead of prompting for a password (there is no one to type it).
SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-T"]


def ssh_argv(ssh: str, host: str) -> list[str]:
    """``ssh`` (the user's command, with its own options: ``ssh -p 2222 -i key``) to ``host``."""
    try:
        words = shlex.split(ssh)
    except ValueError as exc:
        raise HostError(f"--ssh {ssh!r}: {exc}") from None
    if not words:
        raise HostError("--ssh: empty command")
    return [*words, *SSH_OPTIONS, host]


def peer_env(slot: Slot, world_size: int, coordinator: str, job_id: str, options: Options,
             store: tuple[str, int] | None = None) -> dict[str, str]:
    """The variables that place one peer in the job (everything but the key); with ``store``
    (`torch_store`), also torch.distributed's ``MASTER_ADDR`` and ``MASTER_PORT``, as torchrun
    exports them."""
    return {
        **({"MASTER_ADDR": store[0], "MASTER_PORT": str(store[1])} if store else {}),
        "RANK": str(slot.rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(slot.local_rank),
        "LOCAL_WORLD_SIZE": str(slot.local_world_size),
        COORDINATOR_VAR: coordinator,
        JOB_ID_VAR: job_id,
        "PYTHONUNBUFFERED": "1",  # lines reach the launcher as they are printed
        **options.to_env(),
    }


def torch_store(slots: list[Slot], advertise: str | None = None, rank0_address: str | None = None) -> tuple[str, int]:
    """Where torch.distributed's store listens (rank 0 starts it), so that a DDP script's
    ``init_process_group()`` (``env://``) runs under p2plearn-run as under torchrun.

    The user's ``MASTER_ADDR`` / ``MASTER_PORT`` when set; else rank 0's host: loopback when every
    peer runs here, ``rank0_address`` (its testbed namespace's), ``advertise`` or this host's name
    when it runs here, its host's name when remote; and a port free on this host (for a remote
    rank 0 a guess: set ``MASTER_PORT`` to choose)."""
    first = slots[0].host
    if all(s.host.local for s in slots):
        host = "127.0.0.1"
    else:
        host = (advertise or os.uname().nodename) if first.local else first.name
    host = os.environ.get("MASTER_ADDR") or rank0_address or host
    if os.environ.get("MASTER_PORT"):
        return host, int(os.environ["MASTER_PORT"])
    with socket.socket() as s:
        s.bind(("", 0))
        return host, s.getsockname()[1]


def ssh_command(host: str, env: Mapping[str, str], argv: list[str], cwd: str, ssh: str = "ssh") -> list[str]:
    """``ssh`` argv that runs ``argv`` on ``host`` in ``cwd`` with ``env``, reading the job key
    as the first line of stdin. Without ``OMP_NUM_THREADS`` in ``env``, the remote shell sets it
    to the host's cores / ``LOCAL_WORLD_SIZE`` (at least 1). Keep ssh's stdin open while the peer
    runs: when it closes (the launcher stopped or died) a watchdog on the remote side sends
    SIGTERM to the peer, so that nothing is left running there."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    threads = "" if THREADS_VAR in env else (
        f"t=$(( $(nproc) / {int(env.get('LOCAL_WORLD_SIZE', '1'))} )) && "
        f"{{ [ $t -ge 1 ] || t=1; }} && export {THREADS_VAR}=$t && ")
    script = (
        f"IFS= read -r {KEY_VAR} && export {KEY_VAR} && cd {shlex.quote(cwd)} && export {exports} && {threads}"
        f"{{ {shlex.join(argv)} </dev/null & }} && p=$! && "
        # A background job's stdin is /dev/null unless redirected explicitly: hand it ssh's stdin.
        "{ (cat >/dev/null; kill -TERM $p 2>/dev/null) <&3 >/dev/null 2>&1 & } 3<&0 && "
        "wait $p"
    )
    return [*ssh_argv(ssh, host), "sh -c " + shlex.quote(script)]


def threads_per_peer(local_world_size: int) -> int:
    """The intra-op threads each of ``local_world_size`` peers on this host gets: its cores
    (those this process may run on) shared out, at least 1."""
    return max(1, len(os.sched_getaffinity(0)) // local_world_size)


def check_reachable(hosts: list[Host], timeout: float = 15.0, ssh: str = "ssh") -> None:
    """Raise HostError naming the first remote host that ssh cannot run a command on."""

    def probe(host: Host) -> str | None:
        try:
            done = subprocess.run([*ssh_argv(ssh, host.name), "true"], stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"no answer in {timeout:g} s"
        lines = done.stderr.strip().splitlines()
        return None if done.returncode == 0 else (lines[-1] if lines else f"ssh exit code {done.returncode}")

    remote = [h for h in hosts if not h.local]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(remote)))) as pool:
        for host, why in zip(remote, pool.map(probe, remote)):
            if why:
                raise HostError(f"host {host.name!r} ({host.where}) is unreachable over ssh: {why}")
