"""The native engine is compiled by cffi (API mode) during `pip install`; everything else is in pyproject.toml."""
from setuptools import setup

setup(cffi_modules=["native/build_p2pcast.py:ffibuilder"])
