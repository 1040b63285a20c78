"""`one_node_cluster(directory)`: a Slurm cluster of this machine alone, for the tests that run srun as a
user does (the README's srun line, one-line errors under srun).

Its slurmctld and slurmd run in the foreground as children of the test, with their configuration,
state, spool and logs in ``directory`` and ports the OS had free, so they touch no system files and
do not meet another test's cluster; both are stopped when the block ends, also on failure. No
munge: ``auth/none`` (the daemons listen on loopback only). `why_not` says why a machine cannot
run one (not root, or Slurm not installed: ``apt-get install slurmctld slurmd slurm-client``).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("srun", "sinfo")
READY_S = 30.0  # the node registers within a second or two; a busy machine may take longer
STEPS_DONE_S = 15.0  # each step's slurmstepd reports its end to slurmd, then leaves


def why_not() -> str | None:
    """Why this machine cannot run a one-node cluster, or None."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name, path=_path()) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; apt-get install slurmctld slurmd slurm-client)"
    if os.geteuid() != 0:
        return "a Slurm cluster of this machine needs root (slurmd starts each task as its user)"
    return None


@contextlib.contextmanager
def one_node_cluster(directory: str | os.PathLike) -> Iterator[dict[str, str]]:
    """Start the cluster; yields the variable a command needs to use it (``SLURM_CONF``)."""
    root = Path(directory)
    for sub in ("state", "spool"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text(_config(root))
    env = {"SLURM_CONF": str(conf)}
    daemons = []
    try:
        for name in DAEMONS:
            log = open(root / f"{name}.log", "w")
            daemons.append(subprocess.Popen([shutil.which(name, path=_path()), "-D", "-f", str(conf)],
                                            env={**os.environ, **env}, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True))
            log.close()
        _wait_idle(env, root, daemons)
        yield env
    finally:
        _wait_steps_done(root / "spool")
        for proc in daemons:
            _stop(proc)
        for pid in _step_daemons(root / "spool"):  # a slurmstepd still reporting to the stopped slurmd
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _config(root: Path) -> str:
    node = socket.gethostname().split(".")[0]
    controller, daemon = _free_ports(2)
    return f"""ClusterName=p2plearn-test
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
SlurmctldPort={controller}
SlurmdPort={daemon}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _wait_idle(env: dict[str, str], root: Path, daemons: list[subprocess.Popen]) -> None:
    """Until the node is idle (registered): a job submitted before would wait or fail."""
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if any(proc.poll() is not None for proc in daemons):
            break
        state = subprocess.run([shutil.which("sinfo", path=_path()), "-h", "-o", "%T"], env={**os.environ, **env},
                               capture_output=True, text=True, timeout=10)
        if state.stdout.strip() == "idle":
            return
        time.sleep(0.2)
    logs = "\n".join(f"{name}: {(root / f'{name}.log').read_text()[-1500:]}" for name in DAEMONS)
    raise RuntimeError(f"the one-node Slurm cluster did not come up in {READY_S:.0f} s:\n{logs}")


def _step_sockets(spool: Path) -> set[str]:
    """The sockets of the live steps (each slurmstepd listens on one in the spool directory)."""
    return {str(path) for path in spool.glob("*") if path.is_socket()}


def _wait_steps_done(spool: Path) -> None:
    deadline = time.monotonic() + STEPS_DONE_S
    while _step_sockets(spool) and time.monotonic() < deadline:
        time.sleep(0.2)


def _step_daemons(spool: Path) -> set[int]:
    """The processes holding a step's socket in ``spool``: slurmstepd runs in a session of its own,
    outside the daemons' groups."""
    paths = _step_sockets(spool)
    with open("/proc/net/unix") as table:  # Num RefCount Protocol Flags Type St Inode [Path]
        inodes = {f"socket:[{fields[6]}]" for fields in map(str.split, table) if len(fields) > 7 and fields[7] in paths}
    pids = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                pids.add(int(fd_dir.parent.name))
    return pids


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the daemon's group, SIGKILL when it lingers."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _path() -> str:
    """PATH with the system's daemon directories (a test runner's PATH may lack /usr/sbin)."""
    return os.pathsep.join(dict.fromkeys([*os.environ.get("PATH", "").split(os.pathsep), "/usr/sbin", "/usr/bin"]))
