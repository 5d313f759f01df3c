"""The one store a ps.torch process talks through, and who this process is.

``init()`` joins the cluster named by the ``DMLC_*`` variables (``python -m ps.launch`` sets
them), or, under ``mpirun``/``srun`` alone, starts its part of one
(ps/collective/selfstart.py). Without either it runs alone (size 1, every collective a
no-op), as Horovod does outside ``horovodrun``, so one script serves both.
"""
from __future__ import annotations

from typing import Any

from ..collective import Job, absent

job = Job("ps.torch")
server_optimizer = False     # set by ServerOptimizer: the servers now update every key they hold


def init(comm: Any = None, *, kvstore: str = "dist_sync") -> None:
    """Join the job (idempotent). ``comm`` (an MPI communicator in Horovod) is not supported.
    ``kvstore="dist_async"`` (ps only) is for ``ServerOptimizer``: each worker's gradients
    update the weights on the servers as they arrive."""
    if comm is not None:
        raise ValueError("ps.torch.init(comm=...) is not supported: ps forms its cluster from the DMLC_* "
                         "variables (python -m ps.launch sets them)")
    if kvstore not in ("dist_sync", "dist_async"):
        raise ValueError(f"kvstore must be 'dist_sync' or 'dist_async', got {kvstore!r}")
    job.init(kvstore)


# Who this process is, and the store it talks through (None alone): the job's own calls,
# bound as Horovod binds its basics' (before init() they raise the job's ValueError)
is_initialized = job.is_initialized
store = job.store
rank = job.rank
size = job.size
local_rank = job.local_rank
local_size = job.local_size
cross_rank = job.cross_rank
cross_size = job.cross_size
is_homogeneous = job.is_homogeneous

# Horovod's timeline: rank 0 writes a chrome://tracing file of its collectives (ps/collective/timeline.py)
start_timeline = job.start_timeline
stop_timeline = job.stop_timeline


def join(device: int = -1) -> int:
    """Horovod's join, for uneven data: this worker is done until every worker joined;
    meanwhile the others' allreduces (and DistributedOptimizer steps) go on with its share
    zero, and their other collectives raise. Returns the last rank to join, the same on
    every worker. ``device`` (where Horovod makes its zero tensors) does not matter on CPU."""
    return job.join()


# What this build has, asked by scripts written for Horovod to choose a code path
mpi_threads_supported = mpi_enabled = mpi_built = gloo_enabled = gloo_built = absent
ddl_built = ccl_built = cuda_built = rocm_built = absent


def shutdown() -> None:
    """Leave the job until the next ``init()`` (the store stays connected for it: Job.shutdown)."""
    global server_optimizer
    job.shutdown()
    if not job.kept():          # a kept store's servers still run the ServerOptimizer
        server_optimizer = False
