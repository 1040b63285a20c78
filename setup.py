"""The native modules are compiled by cffi (API mode) during `pip install`: the engine (p2plearn._p2pcast) and
the planner and merge (p2plearn._p2pcompute). Everything else is in pyproject.toml."""
from setuptools import setup

setup(cffi_modules=["native/build_p2pcast.py:ffibuilder", "native/build_compute.py:ffibuilder"])
