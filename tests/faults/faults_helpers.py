"""A job of trainer.py peers started without a launcher (as torchrun does), and its cleanup."""

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINER = os.path.join(ROOT, "tests", "faults", "trainer.py")


def free_port_pair() -> int:
    """A MASTER_PORT whose next port (the coordinator's) is free too."""
    while True:
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port


class PeerLines:
    """What a job's peers printed: ``lines[rank]``, and ``output()`` for an assertion's message."""

    lines: dict[int, list[str]]

    def output(self) -> str:
        raise NotImplementedError

    def wait_line(self, rank: int, text: str, timeout: float) -> None:
        """Wait until rank's output has a line containing ``text``."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines[rank]):
            if time.monotonic() > deadline:
                raise AssertionError(f"rank {rank} never printed {text!r}: {self.output()}")
            time.sleep(0.1)


class Job(PeerLines):
    """``n`` trainer peers; ``lines[rank]`` collects each peer's output as it comes."""

    def __init__(self, n: int, out: str, *, seconds: float | None = None, steps: int | None = None,
                 average: bool = False, launcher: str = "torchrun", step_time: float = 0.05, env: dict | None = None,
                 netns: str | None = None, flags: tuple[str, ...] = ()):
        """Train for ``seconds``, or ``steps`` steps; ``average``: end with ``average_model()``;
        ``flags``: more of trainer.py's.
        ``launcher``: the variables the peers get: "torchrun" (RANK, WORLD_SIZE, MASTER_ADDR) or
        "mpirun" (Open MPI's OMPI_COMM_WORLD_*, the coordinator's host found by the runtime)."""
        self.n, self.out = n, out
        self.launcher = launcher
        self.prefix = ["ip", "netns", "exec", netns] if netns else []  # exec: the peer keeps the pid
        port = free_port_pair()
        self.job_id = "faults-" + secrets.token_hex(4)
        ranks = {"WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1"} if launcher == "torchrun" else \
            {"OMPI_COMM_WORLD_SIZE": str(n), "OMPI_COMM_WORLD_LOCAL_SIZE": str(n)}
        base = {**os.environ, **ranks, "MASTER_PORT": str(port),
                "P2PLEARN_JOB_ID": self.job_id, "P2PLEARN_JOB_KEY": secrets.token_hex(32),
                "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                "P2PLEARN_PERIOD": "1", "P2PLEARN_FANOUT": "2",  # the tests count rounds: one per step
                **(env or {})}
        self.env, self.step_time = base, step_time
        self.budget = ["--seconds", str(seconds)] if steps is None else ["--steps", str(steps)]
        self.budget += (["--average"] if average else []) + list(flags)
        self.lines: dict[int, list[str]] = {r: [] for r in range(n)}
        self.ready: dict[int, tuple[int, int]] = {}  # rank -> (pid, coordinator pid)
        self.procs: list[subprocess.Popen] = []  # one per rank, then the restarted ones
        for rank in range(n):
            self.start(rank)

    def start(self, rank: int, seconds: float | None = None) -> None:
        """Start rank's peer, with the variables its first start had (a restart, when it ran before);
        ``seconds`` replaces the job's training budget."""
        self.ready.pop(rank, None)
        budget = self.budget if seconds is None else ["--seconds", str(seconds)]
        rank_vars = {"RANK": str(rank)} if self.launcher == "torchrun" else \
            {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_RANK": str(rank)}
        proc = subprocess.Popen([*self.prefix, sys.executable, TRAINER, *budget, "--step-time", str(self.step_time),
                                 "--out", self.out], env={**self.env, **rank_vars}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        threading.Thread(target=self._pump, args=(rank, proc), daemon=True).start()

    def _pump(self, rank: int, proc: subprocess.Popen) -> None:
        for raw in iter(proc.stdout.readline, b""):
            # under mpirun's variables a rank tags its lines itself (p2plearn.rank_output)
            line = raw.decode(errors="replace").rstrip().removeprefix(f"[{rank}] ")
            self.lines[rank].append(line)
            if line.startswith("ready "):
                _, r, pid, coordinator = line.split()
                self.ready[int(r)] = (int(pid), int(coordinator))

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.ready) < self.n:
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in self.procs):
                raise AssertionError(f"the job did not start: {self.output()}")
            time.sleep(0.05)

    @property
    def coordinator_pid(self) -> int:
        return self.ready[0][1]

    def wait(self, timeout: float = 180.0) -> list[int]:
        """Exit codes of every peer."""
        deadline = time.monotonic() + timeout
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"a peer did not finish in {timeout:g} s: {self.output()}") from None
        return codes

    def result(self, rank: int) -> dict | None:
        path = os.path.join(self.out, f"rank-{rank}.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def output(self) -> str:
        """Each rank's last lines, and the state a failed peer printed (see trainer.py) wherever it is."""
        def shown(lines: list[str]) -> list[str]:
            return [line for line in lines[:-15] if line.startswith("state ")] + lines[-15:]
        return "\n".join(f"[{r}] {line}" for r, lines in self.lines.items() for line in shown(lines))

    def close(self) -> None:
        """Kill whatever is left: peers (their groups) and every coordinator process they started."""
        for proc in self.procs:
            _kill(proc.pid, group=True)
        for _, coordinator in self.ready.values():
            if coordinator:
                _kill(coordinator, group=True)
        for proc in self.procs:
            proc.wait()
        for pid in coordinators_of(self.job_id):  # successors started by peers during the test
            _kill(pid, group=False)


def _kill(pid: int, group: bool) -> None:
    try:
        os.killpg(pid, signal.SIGCONT) if group else None
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def coordinators_of(job_id: str) -> list[int]:
    """Pids of the coordinator processes of a job (found by the job id on their command line)."""
    found = subprocess.run(["pgrep", "-f", f"p2plearn.control --job-id {job_id}"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


class LaunchedJob(PeerLines):
    """``n`` trainer peers under p2plearn-run (its coordinator, its supervision, its exit code);
    ``lines[rank]`` collects each peer's output as it comes, ``launcher_lines`` the launcher's own."""

    def __init__(self, n: int, out: str, *, steps: int, sync: str, step_time: float = 0.05):
        env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
               "P2PLEARN_PERIOD": "1", "P2PLEARN_FANOUT": "2"}
        argv = [sys.executable, "-m", "p2plearn.launch", "-np", str(n), "--sync", sync, "--", sys.executable, TRAINER,
                "--steps", str(steps), "--step-time", str(step_time), "--average", "--out", out]
        self.n = n
        self.lines: dict[int, list[str]] = {r: [] for r in range(n)}
        self.launcher_lines: list[str] = []
        self.pids: dict[int, int] = {}  # rank -> its peer's pid, once it is ready
        self.job_id: str | None = None  # the launcher's, read from its coordinator's command line
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip()
            rank, _, text = line.partition("] ")
            if not (rank.startswith("[") and rank[1:].isdigit()):
                self.launcher_lines.append(line)
                continue
            self.lines[int(rank[1:])].append(text)
            if text.startswith("ready "):
                self.pids[int(rank[1:])] = int(text.split()[2])

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.pids) < self.n:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"the job did not start: {self.output()}")
            time.sleep(0.05)
        with open(f"/proc/{self._coordinators()[0]}/cmdline") as f:
            argv = f.read().split("\0")
        self.job_id = argv[argv.index("--job-id") + 1]

    def _coordinators(self) -> list[int]:
        """The launcher's coordinator (its child, while the launcher lives), and any successor a peer started."""
        found = subprocess.run(["pgrep", "-P", str(self.proc.pid), "-f", "p2plearn.control"],
                               capture_output=True, text=True)
        return [int(pid) for pid in found.stdout.split()] + (coordinators_of(self.job_id) if self.job_id else [])

    def wait(self, timeout: float) -> int:
        """The launcher's exit code, once its output is read to the end."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the launcher did not finish in {timeout:g} s: {self.output()}") from None
        self._pump.join(timeout=5.0)
        return code

    def output(self) -> str:
        peers = [f"[{r}] {line}" for r, lines in self.lines.items() for line in lines[-15:]]
        return "\n".join(peers + self.launcher_lines[-10:])

    def close(self) -> None:
        """Kill whatever is left: the peers (their groups: a stopped one too), the launcher and
        every coordinator of the job (the launcher's, and any successor a peer started)."""
        for pid in self.pids.values():
            _kill(pid, group=True)
        coordinators = self._coordinators()
        _kill(self.proc.pid, group=True)
        self.proc.wait()
        for pid in coordinators:
            _kill(pid, group=False)
