"""p2plearn-run --hostfile across hosts over ssh (root): the testbed's namespaces act as hosts.

Each namespace runs its own sshd (a key made for the test, nothing of the machine's ssh setup is
touched); the launcher runs in the first one and reaches every host, itself included, by its
address over ssh, like a head node of a cluster. Namespaces share the file system, as the nodes of
a cluster share a home directory, so each peer finds the same Python and working directory.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from launch_helpers import ROOT

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(900)]

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
TRAINER = os.path.join(ROOT, "tests", "faults", "trainer.py")
HOSTS = 3

if os.geteuid() != 0 or not os.path.exists(SSHD) or not shutil.which("ssh"):
    pytest.skip("needs root, sshd and ssh (apt-get install openssh-server openssh-client)", allow_module_level=True)
try:
    from p2plearn import testbed as namespaces  # not "Testbed" here: pytest would collect it
    from p2plearn.topology import Topology
except ImportError as exc:
    pytest.skip(f"testbed unavailable: {exc}", allow_module_level=True)


def ssh_keys(directory):
    """A host key and a client key; the client's public key is the only one sshd accepts."""
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(directory, name)],
                       check=True)
    shutil.copy(os.path.join(directory, "client.pub"), os.path.join(directory, "authorized_keys"))


def sshd_config(directory, address):
    path = os.path.join(directory, f"sshd-{address}.conf")
    with open(path, "w") as f:
        f.write(f"ListenAddress {address}\nPort 22\nHostKey {directory}/host\n"
                f"AuthorizedKeysFile {directory}/authorized_keys\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                f"PidFile {directory}/sshd-{address}.pid\n")
    return path


def wait_listening(testbed, peer, address, timeout=20.0):
    """Until ``address``:22 accepts a connection from ``peer``'s namespace."""
    probe = (f"import socket,sys\ns=socket.socket()\ns.settimeout(1)\n"
             f"sys.exit(s.connect_ex(({address!r},22)))")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if testbed.run(peer, [sys.executable, "-c", probe]).wait(timeout=10) == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"sshd at {address} did not listen within {timeout:g} s")


def test_hostfile_job_trains_across_hosts_over_ssh(tmp_path):
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
    ssh_keys(str(tmp_path))
    nodes = [{"id": f"h{i}", "uplink_mbit": 200.0, "downlink_mbit": 200.0} for i in range(HOSTS)]
    out = tmp_path / "out"
    out.mkdir()
    with namespaces.Testbed(Topology.from_data({"nodes": nodes}), f"mh{os.getpid() % 100000}") as testbed:
        addresses = [testbed.address(f"h{i}") for i in range(HOSTS)]
        daemons = [testbed.run(f"h{i}", [SSHD, "-D", "-e", "-f", sshd_config(str(tmp_path), addresses[i])],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(HOSTS)]
        try:
            for address in addresses:
                wait_listening(testbed, "h0", address)
            hostfile = tmp_path / "hosts"
            hostfile.write_text("".join(f"{a} slots=1\n" for a in addresses))
            ssh = (f"ssh -i {tmp_path}/client -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                   f"-o LogLevel=ERROR")
            launcher = testbed.run("h0", [sys.executable, "-m", "p2plearn.launch", "--hostfile", str(hostfile),
                                          "--ssh", ssh, "--advertise", addresses[0], "--",
                                          sys.executable, TRAINER, "--seconds", "6", "--out", str(out)],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
            try:
                stdout, stderr = launcher.communicate(timeout=600)
            finally:
                if launcher.poll() is None:
                    os.killpg(launcher.pid, 9)
                    launcher.wait()
        finally:
            for daemon in daemons:
                daemon.terminate()
                daemon.wait(timeout=10)
    assert launcher.returncode == 0, stdout[-2000:] + stderr[-3000:]
    results = {r["rank"]: r for r in (json.loads(p.read_text()) for p in out.glob("rank-*.json"))}
    assert sorted(results) == list(range(HOSTS)), stdout[-2000:]
    # Each rank ran on its own host (its engine on that namespace's address) and mixed with the others.
    assert sorted(r["engine"][0] for r in results.values()) == sorted(addresses)
    for r in results.values():
        assert r["rounds"] > 0 and r["finite"], r
        assert set(r["mixed_with"]) == set(range(HOSTS)) - {r["rank"]}, r
    for rank in range(HOSTS):  # every peer's summary line came back over ssh
        assert f"[{rank}] p2plearn rank {rank}:" in stdout, stdout[-2000:]
