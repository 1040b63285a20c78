"""p2plearn: peer-to-peer decentralized training for PyTorch over lossy, heterogeneous networks.

The layers, top to bottom (nothing imports upward):

- ``p2plearn.train``      torch integration (the user-facing API), data sets
- ``p2plearn.distributed`` / ``p2plearn.ddp``  the ``p2plearn`` torch.distributed backend, the loss-tolerant DDP hook
- ``p2plearn.checkpoint`` per-rank checkpoints; resuming a job from a round every rank saved
- ``p2plearn.sync``       the round core: BSP, SSP and partitioned rounds (one ``PartExchange`` for
                          training, the DDP backend and the simulator), inbox, mask-aware merging
- ``p2plearn.selection``  receiver selection (SELMCAST, random-p, all, ring, exponential)
- ``p2plearn.tolerance``  loss-tolerance policies (per-layer bounds and deadlines)
- ``p2plearn.filter``     value-bounded update filter
- ``p2plearn.control``    pyzmq control plane (rendezvous, membership, heartbeats, global view)
- ``p2plearn.transport``  the native engine's Python face (Channel) and a TCP baseline
- ``p2plearn.compute``    the compiled merge and SELMCAST planner
- ``p2plearn.launch``     the ``p2plearn-run`` launcher
- ``p2plearn.rendezvous`` finding the job (rank, size, secret, coordinator address), for ``init()`` and the launcher
- ``p2plearn.protocols``  the data channel and control client as the code handed one uses them (typing only)
- ``p2plearn.topology`` / ``p2plearn.testbed`` / ``p2plearn.sim``  networks: described, built, simulated

Importing the package imports none of them: each name below, and each subpackage, is imported at
its first use. torch imports ``p2plearn.distributed.plugin`` as it starts (to register the
``p2plearn`` backend), so every torch program pays for what this file imports.
"""

import importlib
import importlib.util
import sys

if "torch" in sys.modules:  # torch without p2plearn's entry point (a source tree never installed): register here
    from p2plearn.distributed.plugin import register

    register()

__version__ = "0.1.0"
__all__ = ["init", "Runtime", "Options", "add_arguments", "DecentralizedOptimizer", "JobEnded", "data", "checkpoint"]

# name -> the module that defines it (torch is imported only by programs that train)
_EXPORTS = {"Options": "p2plearn.options", "add_arguments": "p2plearn.options", "Runtime": "p2plearn.runtime",
            "init": "p2plearn.runtime", "DecentralizedOptimizer": "p2plearn.train", "JobEnded": "p2plearn.train",
            "data": "p2plearn.train"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if not name.startswith("_") and importlib.util.find_spec(f"p2plearn.{name}") is not None:
        return importlib.import_module(f"p2plearn.{name}")  # a subpackage, as after ``import p2plearn.<name>``
    raise AttributeError(f"module 'p2plearn' has no attribute {name!r}")
