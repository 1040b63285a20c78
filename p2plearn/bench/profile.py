"""Where a benchmark's CPU goes: perf samples of its processes' steady rounds, grouped by phase.

`bench average --profile` and `bench ddp --profile` record each job's processes (`perf record -g -p
<pids>`) for --profile-seconds once every one of them has finished its warm-up rounds, and print
each phase's share of their CPU beside the ratios. A phase (GROUPS) is a group of perf's (shared
object, symbol) pairs: `phase_of` says which. The processes say when their warm-up is over by
`mark_steady` (a file named after their pid in a directory the benchmark gives them), which is also
how the profiler learns their pids, wherever a launcher or a testbed started them.

Tuning: --profile-seconds longer than a few rounds (a short window catches one phase of a round
more than another); --profile-dir keeps the perf.data files, for `perf report -i FILE -G` (who
calls what, e.g. `-S clear_page_erms`: who faults pages in).
"""
from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

DIR_VAR = "P2PBENCH_PROFILE_DIR"  # where a process marks its steady state (not P2PLEARN_*: the launcher checks those)
AFTER_VAR = "P2PBENCH_PROFILE_AFTER"  # after how many rounds or steps it does
STOP_S = 30  # how long perf may take to stop by itself after the job ended, before it is interrupted
KERNEL_COPY = re.compile(r"copy_(to|from)_iter|copy_user|rep_movs_alternative|copy_page_(to|from)_iter|csum_partial_copy")
PAGE_FAULT = re.compile(r"clear_(huge_)?page|page_fault|handle_mm_fault|do_anonymous_page|alloc_pages|get_page_from_freelist|"
                        r"rmqueue|zap_pte_range|unmap_page_range|free_unref_page|free_pcppages_bulk|release_pages|"
                        r"mem_cgroup_charge|lru_add")
MEMCPY = re.compile(r"mem(move|cpy|set)")
ENGINE_TAGS = re.compile(r"ghash|gmac|auth_|datagram_tag")  # the engine's own GHASH (native/ghash.c), its tag calls
LIBRARIES = (("merge", re.compile(r"_p2pcompute")), ("engine", re.compile(r"_p2pcast")),
             ("numpy", re.compile(r"_multiarray|.*openblas")), ("torch", re.compile(r"libtorch|libc10")),
             ("Python", re.compile(r"libpython|python3|_cffi_backend")))  # by the shared object's name
# (phase, what it holds); `phase_of` decides which samples go where, in this order.
GROUPS = (
    ("kernel copies", "the socket's copies to and from user memory (_copy_to_iter, _copy_from_iter, ...)"),
    ("page faults", "faulting in, zeroing and unmapping pages (exc_page_fault, clear_page_*, zap_pte_range, ...)"),
    ("other kernel", "the rest of the kernel: UDP/TCP, scheduling, syscalls"),
    ("tags", "the datagrams' AES-GMAC tags: libcrypto, and the engine's own GHASH"),
    ("memcpy", "libc's memmove/memcpy/memset"),
    ("merge", "_p2pcompute: the merge, change norms, the Hadamard transform"),
    ("engine", "_p2pcast: the transport engine, less its tags"),
    ("numpy", "numpy's C code"),
    ("torch", "libtorch/libc10: the model's forward and backward, gloo"),
    ("Python", "the interpreter (libpython) and cffi's calls into the C modules"),
    ("other", "everything else (other libraries, unresolved symbols)"),
)
PHASES = tuple(name for name, _ in GROUPS)


def phase_of(dso: str, symbol: str) -> str:
    """The phase of one perf report line: its shared object and its symbol ("[k] name" in the kernel)."""
    name = symbol.split("] ", 1)[-1]
    if symbol.startswith("[k]") or dso.startswith("[kernel"):
        return ("kernel copies" if KERNEL_COPY.search(name) else "page faults" if PAGE_FAULT.search(name)
                else "other kernel")
    if dso.startswith("libcrypto") or (dso.startswith("_p2pcast") and ENGINE_TAGS.search(name)):
        return "tags"
    if dso.startswith("libc.so") or dso.startswith("libc-"):
        return "memcpy" if MEMCPY.search(name) else "other"
    return next((phase for phase, pattern in LIBRARIES if pattern.match(dso)), "other")


def group_report(text: str) -> dict[str, float]:
    """Percent of the samples per phase (every phase, summing to 100 when any line parsed) from
    `perf report --no-children --sort dso,sym -g none -t '|'`: lines ``  41.20% |dso|[k] symbol``."""
    shares = dict.fromkeys(PHASES, 0.0)
    for line in text.splitlines():
        fields = line.split("|", 2)
        if line.startswith("#") or len(fields) != 3 or not fields[0].strip().endswith("%"):
            continue
        shares[phase_of(fields[1].strip(), fields[2].strip())] += float(fields[0].strip().rstrip("%"))
    total = sum(shares.values())
    return {k: 100 * v / total for k, v in shares.items()} if total else shares


def unavailable() -> str | None:
    """Why perf cannot profile here (a line to print), or None when it can."""
    if not shutil.which("perf"):
        return "perf is not installed"
    with tempfile.TemporaryDirectory(prefix="p2pbench-perf-") as tmp:
        probe = subprocess.run(["perf", "record", "-q", "-o", os.path.join(tmp, "probe.data"), "--", "true"],
                               capture_output=True, text=True)
    if probe.returncode:
        why = (probe.stderr.strip().splitlines() or ["no message"])[0]
        return f"perf is not permitted here ({why})"
    return None


def add_arguments(parser) -> None:
    """--profile, --profile-seconds and --profile-dir, for a benchmark that starts its jobs with `Profile`."""
    parser.add_argument("--profile", action="store_true",
                        help="also record each job's processes with perf after the warm-up and print each phase's "
                             "share of their CPU (needs perf, and the right to attach to them)")
    parser.add_argument("--profile-seconds", type=float, default=5.0,
                        help="--profile: seconds recorded per job; the job must run at least that long after its "
                             "warm-up (default: %(default)s)")
    parser.add_argument("--profile-dir", default=None,
                        help="--profile: keep each job's perf.data there, for perf report (default: removed)")


def wanted(args) -> bool:
    """Whether to profile: --profile given and perf usable; when it is not, one line on stderr says
    so and the benchmark runs without it."""
    if not args.profile:
        return False
    why = unavailable()
    if why:
        print(f"--profile: {why}; the benchmark runs without the profile", file=sys.stderr)
    return why is None


def mark_steady(done: int) -> None:
    """A benchmark's process says it has done `done` rounds or steps: when that is the warm-up the
    profiler waits for, it drops a file named after its pid (nothing happens without --profile)."""
    where, after = os.environ.get(DIR_VAR), os.environ.get(AFTER_VAR)
    if where and after and done == int(after):
        Path(where, str(os.getpid())).touch()


class Profile:
    """Records one job's processes in the background: ``with Profile(n, warm, seconds) as prof:``
    start the job with ``prof.env`` added to its environment; after the block, ``prof.shares`` (percent
    per phase, or None) and ``prof.note`` (why none, or how many samples).

    Threads: the recording runs on a thread of its own, from the block's start to its end; read
    ``shares`` and ``note`` after the block only."""

    def __init__(self, processes: int, warm: int, seconds: float, keep_dir: str | None = None, name: str = "job"):
        self.processes, self.seconds, self.name = processes, seconds, name
        self._tmp = tempfile.TemporaryDirectory(prefix="p2pbench-profile-")
        self._marks = Path(self._tmp.name, "marks")
        self._marks.mkdir()
        self._data = Path(keep_dir or self._tmp.name, f"{name}.perf.data")
        self.env = {DIR_VAR: str(self._marks), AFTER_VAR: str(warm)}
        self.shares: dict[str, float] | None = None
        self.note = "the job ended before every process finished its warm-up"
        self._done = threading.Event()  # set when the job ended: stop waiting or recording
        self._thread = threading.Thread(target=self._record, name=f"profile-{name}", daemon=True)

    def __enter__(self) -> "Profile":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self._tmp.cleanup()

    def _record(self) -> None:
        while len(pids := os.listdir(self._marks)) < self.processes:
            if self._done.wait(0.05):
                return
        self._data.parent.mkdir(parents=True, exist_ok=True)
        ctl, ack = Path(self._tmp.name, "ctl"), Path(self._tmp.name, "ack")
        os.mkfifo(ctl)
        os.mkfifo(ack)
        # -D -1: no samples until "enable" on the control fifo, acknowledged once they are on. The window
        # starts then, not when perf starts: it reads every mapping of the processes first, seconds
        # for processes that loaded torch, on busy cores.
        perf = subprocess.Popen(["perf", "record", "-q", "-g", "-D", "-1", "--control", f"fifo:{ctl},{ack}",
                                 "-o", str(self._data), "-p", ",".join(pids)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        ctl_fd, ack_fd = os.open(ctl, os.O_RDWR), os.open(ack, os.O_RDWR)  # (read-write: opening a fifo never blocks)
        try:
            os.write(ctl_fd, b"enable\n")
            ended = not self._acknowledged(ack_fd, perf) or self._done.wait(self.seconds)
        finally:
            os.close(ctl_fd)
            os.close(ack_fd)
        if perf.poll() is None and not ended:
            perf.send_signal(signal.SIGINT)
        try:  # once the job has ended, perf stops by itself when it sees the last process exit
            _, err = perf.communicate(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            perf.send_signal(signal.SIGINT)
            _, err = perf.communicate()
        self._read(err, ended)

    def _acknowledged(self, ack_fd: int, perf: subprocess.Popen) -> bool:
        """Whether perf said its events are on (False: it ended, or the job did, before)."""
        while perf.poll() is None and not self._done.is_set():
            if select.select([ack_fd], [], [], 0.1)[0]:
                return os.read(ack_fd, 64).startswith(b"ack")
        return False

    def _read(self, perf_errors: str, ended: bool) -> None:
        report = subprocess.run(["perf", "report", "-i", str(self._data), "--no-children", "--sort", "dso,sym",
                                 "-g", "none", "-t", "|", "--stdio"], capture_output=True, text=True)
        samples = re.search(r"^# Samples: (\S+)", report.stdout, re.M)
        if not samples:
            why = next((line.strip() for line in (perf_errors + report.stderr).splitlines() if line.strip()),
                       "no samples")
            self.note = f"perf recorded nothing ({why[:120].replace('|', '/')}): give the job more rounds"
            return
        self.shares = group_report(report.stdout)
        header = subprocess.run(["perf", "report", "-i", str(self._data), "--header-only"], capture_output=True, text=True)
        duration = re.search(r"sample duration\s*:\s*([\d.]+) ms", header.stdout)
        over = f"{float(duration.group(1)) / 1e3:.1f} s" if duration else "?"
        cut = " (cut short: the job ended first)" if ended else ""
        self.note = f"{samples.group(1)} samples over {over}{cut}"


def print_table(rows: list[tuple[str, Profile | None]], about: str) -> None:
    """The phases' shares of each row's processes' CPU, as a Markdown table after the benchmark's own."""
    print(f"\nCPU by phase: perf samples of {about}, steady rounds (after the warm-up), % of their CPU\n")
    print("| " + " | ".join(("row", *PHASES, "samples")) + " |")
    print("|" + "---|" * (len(PHASES) + 2))
    for label, prof in rows:
        if prof is None or prof.shares is None:
            print(f"| {label} | " + " | ".join("" for _ in PHASES) + f" | {prof.note if prof else 'not profiled'} |")
        else:
            print(f"| {label} | " + " | ".join(f"{prof.shares[p]:.1f}" for p in PHASES) + f" | {prof.note} |")
    print("\nPhases:\n" + "\n".join(f"- {name}: {what}" for name, what in GROUPS))
