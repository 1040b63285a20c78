"""auth.c alone: a new session when the datagram counter wraps, and tags that cover every byte and the
destination (auth_wrap.c)."""
from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NATIVE = os.path.join(ROOT, "native")


def test_the_iv_never_repeats_at_the_counters_wrap_and_the_tag_covers_every_byte_and_the_destination(tmp_path):
    exe = tmp_path / "auth_wrap"
    subprocess.run(["gcc", "-O1", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-pthread", "-I", NATIVE,
                    os.path.join(NATIVE, "auth.c"), os.path.join(NATIVE, "ghash.c"), os.path.join(NATIVE, "wire.c"),
                    os.path.join(ROOT, "tests", "native", "auth_wrap.c"), "-lcrypto", "-o", str(exe)], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "auth_wrap: ok" in run.stdout, run.stderr
