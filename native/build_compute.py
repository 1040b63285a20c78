"""cffi API-mode builder for the SELMCAST planner, the merge and compression, run by `pip install` (setup.py: cffi_modules).

They are a module of their own (p2plearn._p2pcompute, API in compute.h) so that selection and sync
call them without loading the transport's engine. The cdef comes from compute.h, and the compiler
flags from the engine's builder: P2PCAST_SANITIZE=1 (`make asan`) sanitizes both modules.
"""
import os
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # cffi runs this file by its path, which does not make its siblings importable
from build_p2pcast import _cdef_text, _compile_args  # noqa: E402

SOURCES = ["planner.c", "planner_steps.c", "planner_model.c", "planner_heap.c", "merge.c", "change.c", "robust.c", "hadamard.c", "quantize.c", "contribution.c", "error.c"]

ffibuilder = FFI()
ffibuilder.cdef(_cdef_text("compute.h"))
_cflags, _ldflags = _compile_args()
ffibuilder.set_source(
    "p2plearn._p2pcompute",
    '#include "compute.h"',
    sources=[os.path.relpath(os.path.join(HERE, s)) for s in SOURCES],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=_cflags,
    extra_link_args=_ldflags,
    libraries=["m"],  # the planner's and the merge's math (log, isfinite, ...)
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
