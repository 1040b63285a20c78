"""Files the ranks of one job on one host share, when no launcher of ours started them.

Under mpirun, srun or torchrun on one host the ranks meet in a directory private to this user
(``$XDG_RUNTIME_DIR/p2plearn`` or ``/tmp/p2plearn-<uid>``, mode 0700), in a subdirectory named by
the job id and ``MASTER_ADDR``/``MASTER_PORT``:

- ``key``: the job's secret, made by the first rank to arrive (``p2plearn.rendezvous.secret``);
- ``address``: where rank 0's coordinator listens, on a port the OS chose (``p2plearn.runtime``).

Every rank holds a shared lock on its job's subdirectory while it runs; the kernel drops the
lock of a rank that dies, even by SIGKILL. So the last rank of the job to close removes the
subdirectory, whichever rank that is, and a subdirectory left by a job whose every rank was
killed is removed by the next job of this user on this host.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from .errors import SetupError
from .variables import COORDINATOR_VAR, KEY_VAR


class JobFilesError(SetupError, ValueError):
    """The shared directory is not private to this user, or holds something else; the message says what to do."""


def shared_on_this_host(environ: Mapping[str, str], world_size: int, local_world_size: int) -> bool:
    """Whether this job's ranks meet in ``JobFiles``: several ranks, all on this host, no launcher of ours
    (it gives the coordinator), and not both the key and ``MASTER_PORT`` in the environment (then the
    ranks need neither the key file nor rank 0's published port)."""
    launched = bool(environ.get(COORDINATOR_VAR))
    return (1 < world_size <= local_world_size and not launched
            and not (environ.get(KEY_VAR) and environ.get("MASTER_PORT")))


def base_dir(environ: Mapping[str, str]) -> Path:
    """The directory, private to this user, that holds one subdirectory per running job."""
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "p2plearn"
    return Path(tempfile.gettempdir()) / f"p2plearn-{os.getuid()}"


class JobFiles:
    """This rank's hold on its job's shared subdirectory; ``close()`` when the rank is done."""

    def __init__(self, environ: Mapping[str, str], job_id: str) -> None:
        base = base_dir(environ)
        base.mkdir(mode=0o700, exist_ok=True)
        info = base.lstat()
        # In a shared /tmp someone else may have made the directory first, to read our keys.
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise JobFilesError(f"{base} is not a directory that only this user can open: remove it, or point "
                                f"XDG_RUNTIME_DIR to a directory of your own")
        name = f"{job_id}|{environ.get('MASTER_ADDR', '')}|{environ.get('MASTER_PORT', '')}"
        self.path = base / hashlib.sha256(name.encode()).hexdigest()[:32]
        self._fd = self._hold()
        _remove_abandoned(base, keep=self.path)

    def _hold(self) -> int:
        """Open the job's subdirectory with a shared lock, creating it if needed."""
        while True:
            self.path.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)  # removed by the last rank of an earlier job of the same name as we locked it: again

    def key(self) -> str:
        """The job's secret: this rank creates it (random, 256 bits) or reads the one another rank made."""
        path = self.path / "key"
        if not path.exists():
            _write_once(path, secrets.token_hex(32))
        value = path.read_text().strip()
        if len(value) != 64:
            raise JobFilesError(f"{path} does not hold a key: remove it, or set {KEY_VAR}")
        return value

    def publish_address(self, address: str) -> None:
        """Rank 0: tell the others where its coordinator listens."""
        _write_once(self.path / "address", address, replace=True)

    def address(self) -> str | None:
        """The coordinator's published address, or None while rank 0 has not published it."""
        try:
            return (self.path / "address").read_text().strip() or None
        except FileNotFoundError:
            return None

    def wait_address(self, timeout: float, notice: float = 5.0) -> str:
        """The published address, waiting up to ``timeout`` seconds for rank 0 to publish it."""
        start = time.monotonic()
        noticed = False
        while (address := self.address()) is None:
            waited = time.monotonic() - start
            if waited >= timeout:
                raise TimeoutError(f"rank 0 did not publish its coordinator's address in {self.path} within "
                                   f"{timeout:g} s (did rank 0 fail? its output says why)")
            if waited >= notice and not noticed:
                noticed = True
                logging.getLogger("p2plearn").warning("p2plearn: waiting for rank 0 to publish its coordinator's "
                                                      "address (%.0f s so far)", waited)
            time.sleep(0.05)
        return address

    def close(self) -> None:
        """Let go of the job's files; the last rank of the job on this host removes them."""
        if self._fd < 0:
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # granted only when no other rank holds it
        except BlockingIOError:
            pass
        else:
            shutil.rmtree(self.path, ignore_errors=True)
        finally:
            os.close(self._fd)
            self._fd = -1


def _write_once(path: Path, value: str, replace: bool = False) -> None:
    """Write ``path`` atomically (mode 0600); without ``replace``, a file another rank wrote first wins."""
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
    try:
        if replace:
            os.replace(draft, path)
        else:
            os.link(draft, path)  # atomic, and fails when another rank was first: then its value stands
    except FileExistsError:
        pass
    finally:
        draft.unlink(missing_ok=True)


def _remove_abandoned(base: Path, keep: Path) -> None:
    """Remove the subdirectories of jobs none of whose ranks runs any more (all killed, say)."""
    for entry in base.iterdir():
        if entry == keep or not entry.is_dir() or entry.is_symlink():
            continue
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue  # removed meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(entry, ignore_errors=True)
        except BlockingIOError:
            pass  # a rank of that job still runs
        finally:
            os.close(fd)
