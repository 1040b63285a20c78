"""bench.profile: perf's samples grouped into a round's phases (on a canned report), the line said
without perf, the steady-state marks, and (slow, where perf runs) `bench ddp --profile` for real."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace

import pytest

from p2plearn.bench import profile
from p2plearn.bench.profile import PHASES, group_report, phase_of

# `perf report --no-children --sort dso,sym -g none -t '|' --stdio` of a p2plearn round, abridged
CANNED = """\
# To display the perf.data header info, please use --header/--header-only options.
#
#
# Total Lost Samples: 0
#
# Samples: 12K of event 'cpu-clock:pppH'
# Event count (approx.): 3012500000
#
# Overhead|Shared Object|Symbol
#
    30.00% |[kernel.kallsyms]|[k] clear_page_erms
     5.00% |[kernel.kallsyms]|[k] exc_page_fault
     4.00% |[kernel.kallsyms]|[k] _copy_from_iter
     2.00% |[kernel.kallsyms]|[k] _copy_to_iter
     6.00% |[kernel.kallsyms]|[k] udp_sendmsg
     8.00% |libcrypto.so.3|[.] aesni_gcm_encrypt
    10.00% |libc.so.6|[.] __memmove_avx_unaligned_erms
     1.00% |libc.so.6|[.] _int_malloc
     9.00% |_p2pcompute.abi3.so|[.] p2p_merge
     3.00% |_p2pcast.abi3.so|[.] rx_data
     7.00% |_multiarray_umath.cpython-311-x86_64-linux-gnu.so|[.] DOUBLE_add
     2.00% |libtorch_cpu.so|[.] at::native::addmm_out
     6.00% |libpython3.11.so.1.0|[.] _PyEval_EvalFrameDefault
     1.00% |_cffi_backend.cpython-311-x86_64-linux-gnu.so|[.] cdata_call
     3.00% |[unknown]|[.] 0x00007f0000001234
     3.00% |libzmq.so.5|[.] zmq_msg_recv
"""


def test_a_canned_report_is_grouped_into_the_phases():
    shares = group_report(CANNED)
    assert list(shares) == list(PHASES)
    want = {"page faults": 35, "kernel copies": 6, "other kernel": 6, "tags": 8, "memcpy": 10, "merge": 9,
            "engine": 3, "numpy": 7, "torch": 2, "Python": 7, "other": 7}  # other: malloc, [unknown], zmq
    assert shares == pytest.approx(want)


def test_shares_are_of_the_lines_parsed_and_nothing_parsed_is_all_zeros():
    half = "\n".join(line for line in CANNED.splitlines() if "clear_page" not in line)
    assert sum(group_report(half).values()) == pytest.approx(100)
    assert group_report(half)["page faults"] == pytest.approx(5 / 70 * 100)
    assert group_report("# Samples: 0\nError: no samples\n") == dict.fromkeys(PHASES, 0.0)


@pytest.mark.parametrize("dso,symbol,phase", [
    ("[kernel.kallsyms]", "[k] rep_movs_alternative", "kernel copies"),
    ("[kernel.kallsyms]", "[k] zap_pte_range", "page faults"),
    ("[kernel.kallsyms]", "[k] finish_task_switch.isra.0", "other kernel"),
    ("_p2pcast.abi3.so", "[.] ghash_blocks_vpclmul", "tags"),  # the engine's own GHASH
    ("_p2pcast.abi3.so", "[.] tx_send_batch", "engine"),
    ("libc.so.6", "[.] __memset_avx2_unaligned_erms", "memcpy"),
    ("libc.so.6", "[.] free", "other"),
    ("libscipy_openblas64_-ff651d7f.so", "[.] sgemm_kernel", "numpy"),
    ("libc10.so", "[.] c10::TensorImpl::release_resources", "torch"),
])
def test_each_phase_is_recognised_by_its_object_and_symbol(dso, symbol, phase):
    assert phase_of(dso, symbol) == phase


def test_without_perf_one_line_says_so_and_the_benchmark_goes_on(monkeypatch, capsys):
    monkeypatch.setattr(profile.shutil, "which", lambda name: None)
    assert profile.unavailable() == "perf is not installed"
    assert profile.wanted(Namespace(profile=True)) is False
    assert capsys.readouterr().err == "--profile: perf is not installed; the benchmark runs without the profile\n"
    assert profile.wanted(Namespace(profile=False)) is False
    assert capsys.readouterr().err == ""


def test_a_process_marks_its_steady_state_once_after_its_warm_up(monkeypatch, tmp_path):
    monkeypatch.setenv(profile.DIR_VAR, str(tmp_path))
    monkeypatch.setenv(profile.AFTER_VAR, "3")
    for done in (1, 2):
        profile.mark_steady(done)
    assert os.listdir(tmp_path) == []
    profile.mark_steady(3)
    assert os.listdir(tmp_path) == [str(os.getpid())]  # the profiler attaches perf to this pid
    monkeypatch.delenv(profile.DIR_VAR)
    profile.mark_steady(3)  # without --profile: nothing, no error


@pytest.mark.slow
@pytest.mark.skipif(profile.unavailable() is not None, reason=f"perf: {profile.unavailable()}")
def test_bench_ddp_profiles_each_configuration_for_real(tmp_path):
    out = subprocess.run([sys.executable, "-m", "p2plearn.bench", "ddp", "--ranks", "2", "--hidden", "128", "--layers",
                          "2", "--steps", "400", "--configs", "gloo,p2plearn", "--profile", "--profile-seconds", "1",
                          "--profile-dir", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["config"]: r for r in json.loads(out.stdout)}
    for config, row in rows.items():
        assert row["profile"] is not None, row["profile_note"]
        assert sum(row["profile"].values()) == pytest.approx(100)
        assert row["profile"]["torch"] > 0  # the step's forward and backward
        assert (tmp_path / f"ddp-{config}.perf.data").exists()
    assert rows["p2plearn"]["profile"]["engine"] + rows["p2plearn"]["profile"]["merge"] > 0  # its all-reduce
    assert rows["gloo"]["profile"]["engine"] == rows["gloo"]["profile"]["merge"] == 0
