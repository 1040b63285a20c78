"""The environment variables through which ``p2plearn-run`` places each peer in its job.

The launcher (``p2plearn.launch``) sets them; ``p2plearn.init()`` (``p2plearn.runtime``) and the rest
of ``p2plearn.rendezvous`` read them. Both sides name them from here, so that they cannot drift.
The rank variables are torchrun's (``RANK``, ``WORLD_SIZE``, ...: see ``p2plearn.rendezvous.ranks``).
"""

# The job's secret (hex). Never on a command line (``ps`` shows those to every user): a local peer gets
# it in its environment, a remote peer's shell reads it from ssh's stdin.
KEY_VAR = "P2PLEARN_JOB_KEY"
# Where the coordinator the launcher started listens; when it is unset, rank 0 starts one.
COORDINATOR_VAR = "P2PLEARN_COORDINATOR"
# The job's id, the same on every rank (the first of the job ids ``p2plearn.rendezvous.ranks`` reads).
JOB_ID_VAR = "P2PLEARN_JOB_ID"
# Under --testbed: the address in the peer's network namespace that its data engine binds to.
ENGINE_HOST_VAR = "P2PLEARN_ENGINE_HOST"
# A local peer watches its launcher (by pid) and, should it die, writes one line to the launcher's
# stderr, inherited as this descriptor (p2plearn.runtime).
LAUNCHER_PID_VAR = "P2PLEARN_LAUNCHER_PID"
LAUNCHER_FD_VAR = "P2PLEARN_LAUNCHER_FD"
