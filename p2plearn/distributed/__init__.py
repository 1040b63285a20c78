"""``torch.distributed`` over p2plearn's engine: the ``p2plearn`` process-group backend.

torch registers the backend as it starts (the ``torch.backends`` entry point: see `plugin`), so that

    import p2plearn, torch     # in either order
    torch.distributed.init_process_group("p2plearn")

works under torchrun, mpirun, srun and p2plearn-run; importing this package registers it too. See
`backend` (the ProcessGroup), `collectives` (the algorithms over the engine) and `p2plearn.ddp`
(the loss-tolerant DDP hook).
"""
import importlib

from p2plearn.distributed.plugin import BACKEND, register

register()

__all__ = ["BACKEND", "CollectiveError", "Collectives", "CollectiveTimeout", "ProcessGroupP2P", "register"]

# name -> the module that defines it, imported at first use (torch's start imports this package)
_EXPORTS = {"ProcessGroupP2P": "backend", "CollectiveError": "collectives", "Collectives": "collectives",
            "CollectiveTimeout": "collectives"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"p2plearn.distributed.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'p2plearn.distributed' has no attribute {name!r}")
