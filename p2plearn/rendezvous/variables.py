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
# Under p2plearn-run --resume DIR: the checkpoint directory p2plearn.checkpoint.load(None, ...) resumes from.
RESUME_VAR = "P2PLEARN_RESUME"
# Set by the user: rank 0's address, where no launcher gives one (p2plearn.rendezvous.coordinator).
COORDINATOR_HOST_VAR = "P2PLEARN_COORDINATOR_HOST"

# Every P2PLEARN_* variable that is not a training option (those are p2plearn.options'), with the
# data cache (p2plearn.train.data) and the tests' device: a name outside both is a typo, and is warned.
OTHER_VARS = (KEY_VAR, COORDINATOR_VAR, JOB_ID_VAR, ENGINE_HOST_VAR, LAUNCHER_PID_VAR, LAUNCHER_FD_VAR, RESUME_VAR,
              COORDINATOR_HOST_VAR, "P2PLEARN_CACHE", "P2PLEARN_TEST_DEVICE")
