"""The system side of a testbed: running ip/tc/iptables, finding and removing namespaces.

Every namespace of testbed NAME is called ``p2pl-NAME-<suffix>``, so what a crashed run
left behind is found from ``ip netns list`` alone, without its state file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

NAMESPACE_PREFIX = "p2pl-"

# Tool -> the Debian package that provides it.
REQUIRED_TOOLS = {"ip": "iproute2", "tc": "iproute2", "iptables": "iptables"}


class TestbedError(RuntimeError):
    """A testbed cannot be built or used as asked; the message says what to do."""

    __test__ = False  # not a pytest test class, despite the name


class CommandError(RuntimeError):
    """A system command the testbed ran failed."""


def check_can_build() -> None:
    """Raise TestbedError unless this process is root and has ip, tc and iptables."""
    if os.geteuid() != 0:
        raise TestbedError("network namespaces need root: run as root (e.g. with sudo)")
    for tool, package in REQUIRED_TOOLS.items():
        if shutil.which(tool) is None:
            raise TestbedError(f"'{tool}' not found: apt-get install {package}")


def command(*args: str) -> str:
    """Run a command, return its stdout; raise CommandError with its stderr if it fails."""
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise CommandError(f"{' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result.stdout


def namespaces() -> list[str]:
    """Names of all network namespaces (``ip netns list`` prints 'NAME (id: N)')."""
    return [line.split()[0] for line in command("ip", "netns", "list").splitlines() if line]


def namespace_testbeds() -> set[str]:
    """Names of the testbeds that have namespaces, whether or not they have state files."""
    return {
        namespace[len(NAMESPACE_PREFIX) :].rsplit("-", 1)[0]
        for namespace in namespaces()
        if namespace.startswith(NAMESPACE_PREFIX) and "-" in namespace[len(NAMESPACE_PREFIX) :]
    }


def testbed_namespaces(name: str) -> list[str]:
    """The namespaces of testbed ``name`` (names may not contain '-', so no prefix clash)."""
    prefix = f"{NAMESPACE_PREFIX}{name}-"
    return [
        namespace
        for namespace in namespaces()
        if namespace.startswith(prefix) and "-" not in namespace[len(prefix) :]
    ]


def namespace_pids(namespace: str) -> list[int]:
    """Processes running in ``namespace``."""
    return [int(pid) for pid in command("ip", "netns", "pids", namespace).split()]


def stop_processes(pids: list[int], grace_s: float = 2.0) -> None:
    """SIGTERM ``pids``, then SIGKILL those still running after ``grace_s`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        pids = [pid for pid in pids if _running(pid)]
        if not pids:
            return


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie holds no namespace and waits for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def remove_namespaces(name: str) -> None:
    """Stop every process in testbed ``name``'s namespaces, then delete the namespaces.

    Deleting a namespace deletes its veth ends and bridge with it; processes go first
    because a namespace with processes outlives ``ip netns del``.
    """
    owned = testbed_namespaces(name)
    stop_processes([pid for namespace in owned for pid in namespace_pids(namespace)])
    for namespace in owned:
        command("ip", "netns", "del", namespace)


def python_module(module: str, *args: str) -> tuple[list[str], dict[str, str]]:
    """argv and environment that run ``python -m module args`` with this p2plearn importable."""
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    return [sys.executable, "-m", module, *args], {**os.environ, "PYTHONPATH": path}
