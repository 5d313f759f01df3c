"""``import ps.mxnet``: MXNet's ``dist_*`` kvstores run on ps.

Importing this module registers ``dist_sync``, ``dist_async``, ``dist_sync_device``,
``dist_device_sync``, ``dist_async_device`` and ``dist`` with
``mx.kvstore.KVStoreBase.register``, so ``mx.kv.create('dist_sync')``,
``gluon.Trainer(..., kvstore='dist_sync')`` and ``Module.fit(kvstore='dist_sync')`` use ps.
Any other name with "dist" in it, which MXNet would hand to its C++ ps-lite store
(``dist_device_async``, ...), gets a ps store too, read the way MXNet reads it.

``dist_sync_mpi`` and ``dist_async_mpi`` (MXNet's MPI proposal) are the same stores on joint
processes, workers that hold their own server shard (``DMLC_ROLE=joint``, ``python -m
ps.launch --mode mpi``, or a bare ``mpirun``: ps/mxnet/kvstore.py).

In a process whose ``DMLC_ROLE`` is ``server`` or ``scheduler`` the import runs that role
and exits *before* importing mxnet (whose own import would start MXNet's C++ server), so
one script serves every role as long as it imports ``ps.mxnet`` before ``mxnet``.

It also has Horovod's MXNet calls (``import ps.mxnet as hvd``; ps/mxnet/horovod.py).
"""
from __future__ import annotations

import sys

from ..config import SCRIPT_ROLES, role_from_env

if role_from_env() not in SCRIPT_ROLES:     # must happen before anything imports mxnet
    from ..__main__ import main as run_role
    sys.exit(run_role())
if role_from_env() == "joint":              # MXNet's import would start its own server here
    from ..optim.pickled import import_mxnet
    import_mxnet()

import atexit  # noqa: E402
import os  # noqa: E402

from ..collective import Adasum, Average, Max, Min, Product, Sum, nccl_built  # noqa: E402
from ..errors import CollectiveError as HorovodInternalError  # noqa: E402
from .collectives import (ProcessSet, allgather, allgather_object, allreduce, allreduce_, alltoall,  # noqa: E402
                          broadcast, broadcast_, broadcast_object, grouped_allgather, grouped_allreduce,
                          grouped_allreduce_, grouped_reducescatter, reducescatter)
from .horovod import (Compression, DistributedOptimizer, DistributedTrainer, add_process_set,  # noqa: E402
                      broadcast_parameters, ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                      global_process_set, gloo_built, gloo_enabled, init, is_initialized, local_rank, local_size,
                      mpi_built, mpi_enabled, mpi_threads_supported, process_set_by_id, rank, remove_process_set,
                      rocm_built, shutdown, size, start_timeline, stop_timeline)
from .hooks import exit_status, patch_create, patch_trainer, patch_waitall, register, settle_before_fork  # noqa: E402
from .kvstore import PSKVStore  # noqa: E402
from .profiling import patch_profiler  # noqa: E402

globals().update(register())          # ps.mxnet.Dist_Sync, ... (MXNet names them by class)
patch_create()
patch_trainer()
patch_profiler()
patch_waitall()
os.register_at_fork(before=settle_before_fork)
if not getattr(sys.modules.get("sitecustomize"), "PS_FINAL_EXIT_STATUS", False):
    atexit.register(exit_status)       # before any store's: runs after they closed (the autoload
                                       # hook registers it at start-up instead: after everything)

# PSKVStore, and Horovod's MXNet calls (ps/mxnet/horovod.py)
__all__ = ["PSKVStore", "Adasum", "Average", "Compression", "DistributedOptimizer", "DistributedTrainer",
           "HorovodInternalError", "Max", "Min", "ProcessSet", "Product", "Sum", "add_process_set", "allgather",
           "allgather_object", "allreduce", "allreduce_", "alltoall", "broadcast", "broadcast_", "broadcast_object",
           "broadcast_parameters", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
           "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allreduce",
           "grouped_allreduce_", "grouped_reducescatter", "init", "is_initialized", "local_rank", "local_size",
           "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "process_set_by_id", "rank",
           "reducescatter", "remove_process_set", "rocm_built", "shutdown", "size", "start_timeline",
           "stop_timeline"]

