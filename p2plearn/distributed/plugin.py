"""How torch finds the ``p2plearn`` backend: registered as torch imports, whatever the import order.

p2plearn declares `register` in the ``torch.backends`` entry-point group (pyproject.toml), which
torch calls at the end of ``import torch`` (its out-of-tree extension autoloading), so that

    import p2plearn, torch                  # either order; or torch alone
    torch.distributed.init_process_group("p2plearn")

works in any program of an environment p2plearn is installed in (``pip install``, also ``-e``).
``import p2plearn`` registers it too when torch is already imported: that covers a source tree on
``PYTHONPATH`` that was never installed, and ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (torch then loads
no extension; import p2plearn after torch, or ``import p2plearn.distributed``).

Registering is cheap, since every program that imports torch pays it: it imports nothing of
p2plearn's but this module (``p2plearn``'s own ``__init__`` is lazy) and the backend itself
(`p2plearn.distributed.backend`: numpy, the control plane, the engine) only once a process group
is made. Processes that never import torch (the launcher, the coordinator) never run it.
"""
from __future__ import annotations

from typing import Any

BACKEND = "p2plearn"


def register() -> None:
    """Make ``init_process_group("p2plearn")`` build a ProcessGroupP2P (idempotent; a torch built
    without distributed support has nothing to register with)."""
    import os
    import sys

    import torch.distributed as dist

    if os.path.basename(sys.argv[0]) == "torchrun":  # its report of ranks that stopped on a setup mistake: one line
        from p2plearn.rendezvous.errors import shorten_torchrun_report

        shorten_torchrun_report()
    if dist.is_available() and BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])


def _create(options: Any, backend_options: Any) -> Any:
    """The backend's creator, imported when the first group is made (see the module's docstring)."""
    from p2plearn.distributed.backend import create

    return create(options, backend_options)
