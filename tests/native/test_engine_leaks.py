"""The engine alone under AddressSanitizer, UBSan and LeakSanitizer (engine_leaks.c; also `make asan`)."""
from __future__ import annotations

import glob
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_the_engine_leaks_nothing_and_survives_close_while_recv(tmp_path):
    exe = tmp_path / "engine_leaks"
    sources = sorted(glob.glob(os.path.join(ROOT, "native", "*.c")))
    subprocess.run(["gcc", "-O1", "-g", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-pthread",
                    "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-I", os.path.join(ROOT, "native"),
                    *sources, os.path.join(ROOT, "tests", "native", "engine_leaks.c"), "-lcrypto", "-lm",
                    "-o", str(exe)], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
                              "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"})
    if "LeakSanitizer has encountered a fatal error" in run.stderr:  # no ptrace here (some containers)
        pytest.skip("LeakSanitizer cannot stop the world on this machine")
    assert run.returncode == 0 and "engine_leaks: ok" in run.stdout, run.stderr[-4000:]
