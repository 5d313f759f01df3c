"""The one store a ps.torch process talks through, and who this process is.

``init()`` joins the cluster named by the ``DMLC_*`` variables (``python -m ps.launch`` sets
them), or, under ``mpirun``/``srun`` alone, starts its part of one (ps/selfstart.py). Without
either it runs alone (size 1, every collective a no-op), as
Horovod does outside ``horovodrun``, so one script serves both.
"""
from __future__ import annotations

import os
from typing import Any

from .. import KVStore, selfstart

_store: KVStore | None = None
_alone = False
server_optimizer = False     # set by ServerOptimizer: the servers now update every key they hold


def init(comm: Any = None, *, kvstore: str = "dist_sync") -> None:
    """Join the job (idempotent). ``comm`` (an MPI communicator in Horovod) is not supported.
    ``kvstore="dist_async"`` (ps only) is for ``ServerOptimizer``: each worker's gradients
    update the weights on the servers as they arrive."""
    global _store, _alone
    if comm is not None:
        raise ValueError("ps.torch.init(comm=...) is not supported: ps forms its cluster from the DMLC_* "
                         "variables (python -m ps.launch sets them)")
    if _store is not None or _alone:
        return
    selfstart.start()           # under mpirun/srun without ps.launch: make the rendezvous here
    if "DMLC_PS_ROOT_URI" not in os.environ:
        _alone = True
        return
    if kvstore not in ("dist_sync", "dist_async"):
        raise ValueError(f"kvstore must be 'dist_sync' or 'dist_async', got {kvstore!r}")
    _store = KVStore(kvstore)


def is_initialized() -> bool:
    return _store is not None or _alone


def store() -> KVStore | None:
    """The cluster's store, or None when this process runs alone."""
    if not is_initialized():
        raise ValueError("ps.torch.init() has not been called")
    return _store


def rank() -> int:
    kv = store()
    return 0 if kv is None else kv.rank


def size() -> int:
    kv = store()
    return 1 if kv is None else kv.num_workers


def _hosts() -> list[str]:
    kv = store()
    return [""] if kv is None else kv.worker_hosts


def local_rank() -> int:
    hosts = _hosts()
    return hosts[:rank()].count(hosts[rank()])


def local_size() -> int:
    hosts = _hosts()
    return hosts.count(hosts[rank()])


def _peers() -> list[int]:
    """The ranks with this process's local rank, one per host, in rank order (Horovod's
    cross communicator)."""
    hosts, mine = _hosts(), local_rank()
    return [r for r in range(len(hosts)) if hosts[:r].count(hosts[r]) == mine]


def cross_rank() -> int:
    """Which host this is, counting the hosts that run a worker of this local rank."""
    return _peers().index(rank())


def cross_size() -> int:
    return len(_peers())


def is_homogeneous() -> bool:
    """Every host runs the same number of workers."""
    hosts = _hosts()
    return len({hosts.count(h) for h in hosts}) == 1


def join(device: int = -1) -> int:
    """Wait for every worker to get here; returns the last rank to join (Horovod returns the
    last one too). Workers that still have steps to run must not call it: ps has no uneven
    data support, and a sync round missing this worker fails with its rank named.
    ``device`` (where Horovod makes its zero tensors) does not matter on CPU."""
    kv = store()
    if kv is not None:
        kv.barrier()
    return size() - 1


def _absent() -> bool:
    return False


# What this build has, asked by scripts written for Horovod to choose a code path: ps moves
# CPU tensors over its own transport, with none of Horovod's MPI, Gloo, NCCL, DDL or oneCCL.
mpi_threads_supported = mpi_enabled = mpi_built = gloo_enabled = gloo_built = _absent
ddl_built = ccl_built = cuda_built = rocm_built = _absent


def nccl_built() -> int:
    """Horovod returns the NCCL version it was built with, 0 without."""
    return 0


def shutdown() -> None:
    global _store, _alone, server_optimizer
    if _store is not None:
        _store.close()
    _store, _alone, server_optimizer = None, False, False
