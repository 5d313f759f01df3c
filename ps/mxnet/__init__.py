"""``import ps.mxnet``: MXNet's ``dist_*`` kvstores run on ps.

Importing this module registers ``dist_sync``, ``dist_async``, ``dist_sync_device``,
``dist_device_sync``, ``dist_async_device`` and ``dist`` with
``mx.kvstore.KVStoreBase.register``, so ``mx.kv.create('dist_sync')``,
``gluon.Trainer(..., kvstore='dist_sync')`` and ``Module.fit(kvstore='dist_sync')`` use ps.
Any other name with "dist" in it, which MXNet would hand to its C++ ps-lite store
(``dist_device_async``, ...), gets a ps store too, read the way MXNet reads it.

In a process whose ``DMLC_ROLE`` is ``server`` or ``scheduler`` the import runs that role
and exits *before* importing mxnet (whose own import would start MXNet's C++ server), so
one script serves every role as long as it imports ``ps.mxnet`` before ``mxnet``.

It also has Horovod's MXNet calls (``import ps.mxnet as hvd``; ps/mxnet/horovod.py).
"""
from __future__ import annotations

import sys

from ..config import role_from_env

if role_from_env() != "worker":        # must happen before anything imports mxnet
    from ..__main__ import main as run_role
    sys.exit(run_role())

import os  # noqa: E402

from .horovod import (Compression, DistributedOptimizer, DistributedTrainer, allreduce,  # noqa: E402
                      broadcast_parameters, init, local_rank, local_size, rank, size)
from .kvstore import (PSKVStore, patch_create, patch_profiler, patch_trainer, register,  # noqa: E402
                      settle_before_fork)

globals().update(register())          # ps.mxnet.Dist_Sync, ... (MXNet names them by class)
patch_create()
patch_trainer()
patch_profiler()
os.register_at_fork(before=settle_before_fork)

# PSKVStore, and Horovod's MXNet calls (ps/mxnet/horovod.py)
__all__ = ["PSKVStore", "Compression", "DistributedOptimizer", "DistributedTrainer", "allreduce",
           "broadcast_parameters", "init", "local_rank", "local_size", "rank", "size"]

