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
"""

import sys

from p2plearn.options import Options, add_arguments
from p2plearn.runtime import Runtime, init

if "torch" in sys.modules:  # a training program: init_process_group("p2plearn") works (the launcher skips torch)
    import p2plearn.distributed  # noqa: F401  (registers the backend)

__version__ = "0.1.0"
__all__ = ["init", "Runtime", "Options", "add_arguments", "DecentralizedOptimizer", "JobEnded", "data", "checkpoint"]


def __getattr__(name: str):
    if name == "checkpoint":
        import p2plearn.checkpoint as checkpoint

        return checkpoint
    # torch is imported only by programs that train, not by the launcher or the control plane
    if name in ("ddp", "distributed"):
        import importlib

        return importlib.import_module(f"p2plearn.{name}")
    if name in ("DecentralizedOptimizer", "JobEnded", "data"):
        import p2plearn.train as train

        return getattr(train, name)
    raise AttributeError(f"module 'p2plearn' has no attribute {name!r}")
