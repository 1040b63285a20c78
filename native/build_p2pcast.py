"""cffi API-mode builder for the p2pcast engine, run by `pip install` (setup.py: cffi_modules).

The cdef is read from p2pcast.h itself so that the C declarations live in exactly one place.
Set P2PCAST_SANITIZE=1 to build with AddressSanitizer and UndefinedBehaviorSanitizer (`make asan`).
"""
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["api.c", "send.c", "delivery.c", "bufpool.c", "io.c", "datagram.c", "tx.c", "txr.c", "group.c", "batch.c", "pacer.c",
           "rx.c", "rx_store.c", "rx_ack.c", "wire.c", "auth.c", "ghash.c", "replay.c", "mcast.c", "error.c"]


def _cdef_text(header: str = "p2pcast.h") -> str:
    with open(os.path.join(HERE, header)) as f:
        header = f.read()
    header = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    return "\n".join(line for line in header.splitlines() if not line.startswith("#include"))


def _compile_args() -> tuple[list[str], list[str]]:
    cflags = ["-O3", "-std=gnu11", "-Wall", "-Wextra", "-pthread", "-fvisibility=hidden"]
    ldflags = ["-pthread"]
    if os.environ.get("P2PCAST_SANITIZE"):
        cflags = [f for f in cflags if f != "-O3"] + ["-O1", "-g", "-fno-omit-frame-pointer",
                                                      "-fsanitize=address,undefined"]
        ldflags += ["-fsanitize=address,undefined"]
    return cflags, ldflags


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text())
_cflags, _ldflags = _compile_args()
ffibuilder.set_source(
    "p2plearn._p2pcast",
    '#include "p2pcast.h"',
    sources=[os.path.relpath(os.path.join(HERE, s)) for s in SOURCES],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=_cflags,
    extra_link_args=_ldflags,
    libraries=["crypto"],  # OpenSSL's libcrypto: AES-256-GMAC tags (auth.c)
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
