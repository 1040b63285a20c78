"""``torch.distributed`` over p2plearn's engine: the ``p2plearn`` process-group backend.

Importing it registers the backend; ``import p2plearn`` does so when torch is installed, so that

    import p2plearn
    torch.distributed.init_process_group("p2plearn")

works under torchrun, mpirun, srun and p2plearn-run. See `backend` (the ProcessGroup),
`collectives` (the algorithms over the engine) and `p2plearn.ddp` (the loss-tolerant DDP hook).
"""
from p2plearn.distributed.backend import BACKEND, ProcessGroupP2P, register
from p2plearn.distributed.collectives import CollectiveError, Collectives, CollectiveTimeout

register()

__all__ = ["BACKEND", "CollectiveError", "Collectives", "CollectiveTimeout", "ProcessGroupP2P", "register"]
