"""How MXNet comes to use ps's stores, and what its process does around them: the kvstore
names registered with MXNet, its ``create``, ``waitall`` and ``Trainer`` step patched, the
fork and exit hooks. MXNet calls into ps only through what it looks up by name, so every
way in is a patch of MXNet's own; ``ps/mxnet/__init__`` applies them on import.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any

import mxnet as mx

from .engine_ops import mx_waitall
from .kvstore import PSKVStore, failed_at_exit, live_stores, store_class

logger = logging.getLogger(__name__)


def settle_before_fork() -> None:
    """MXNet's own fork handler waits for every engine operation to finish, and it runs while
    the forking thread holds the GIL, which ps's I/O thread needs to finish ours: a fork with
    a pushpull in the engine (a DataLoader starting its worker processes) would hang. So
    let them finish first; waiting here releases the GIL."""
    for store in live_stores():
        try:
            store.settle_engine(raise_errors=False)
        except Exception as exc:  # noqa: BLE001 - a fork must go on; say why it may stall
            logger.error("before fork: %s", exc)


def _kvstore_class(name: str) -> type:
    cls = store_class(name)
    mx.kvstore.KVStoreBase.register(cls)
    return cls


def register() -> dict[str, type]:
    """Register ps's kvstores with MXNet (``mx.kv.create`` and Trainer look there first)."""
    classes = {}
    for name in ("dist_sync", "dist_async", "dist_sync_device", "dist_device_sync",
                 "dist_async_device", "dist", "dist_sync_mpi", "dist_async_mpi"):
        cls = _kvstore_class(name)
        classes[cls.__name__] = cls
    return classes


def patch_create() -> None:
    """MXNet's ``create`` looks its registry up by exact name and passes any other name to its
    C++ ``KVStore::Create``, which makes a ps-lite store of every name containing "dist":
    without this, ``kvstore='dist_device_async'`` would start MXNet's own ps-lite worker
    against ps's scheduler. Such a name gets a ps store of its own (registered on first use)."""
    original = mx.kvstore.base.create
    if getattr(original, "_ps_patched", False):
        return

    @functools.wraps(original)
    def create(name: Any = "local") -> Any:
        if isinstance(name, str):
            lower = name.lower()
            if "dist" in lower and lower not in mx.kvstore.KVStoreBase.kv_registry:
                _kvstore_class(lower)
        return original(name)

    create._ps_patched = True  # type: ignore[attr-defined]
    mx.kvstore.base.create = create
    mx.kvstore.create = create


def patch_waitall() -> None:
    """Native MXNet raises a failed engine operation's error at ``mx.nd.waitall()``. A
    pushpull ps ran in the engine does not hand MXNet its error (the completion callback takes
    a C++ ``dmlc::Error``; docs/mxnet.md says why not), so after MXNet's wait the error is
    raised here, as MXNet would, besides at the store's next call: a script that queues its
    steps and then waits would otherwise finish on weights its failed pushpulls never updated."""
    if getattr(mx.nd.waitall, "_ps_patched", False):
        return

    @functools.wraps(mx_waitall)
    def waitall() -> None:
        mx_waitall()
        for store in live_stores():
            store.raise_engine_error()
    waitall._ps_patched = True  # type: ignore[attr-defined]
    for name, module in list(sys.modules.items()):      # mx.nd, mx.npx and the modules that import it
        if (name == "mxnet" or name.startswith("mxnet.")) and getattr(module, "waitall", None) is mx_waitall:
            module.waitall = waitall


def exit_status() -> None:
    """At exit, after the stores closed (registered before any, and by the autoload hook at
    start-up: after every exit handler): a pushpull that failed where the script never saw it
    (its last steps, queued in MXNet's engine) makes the process exit 1, not 0, so the
    launcher and the job report it. A script that died of an uncaught exception exits 1
    already (``sys.last_value``): nothing to change."""
    failed = failed_at_exit()
    if not failed or getattr(sys, "last_value", None) is not None:
        return
    logger.error("exiting with status 1: %d pushpull error(s) the script never saw (above)", len(failed))
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(1)


def patch_trainer() -> None:
    """A Trainer step sends every parameter's pushpull first and waits once at the end,
    instead of one blocking round trip per parameter."""
    trainer_cls = mx.gluon.Trainer
    original = trainer_cls._allreduce_grads
    if getattr(original, "_ps_patched", False):
        return

    def _allreduce_grads(self: Any) -> None:
        kv = self._kvstore
        if isinstance(kv, PSKVStore):
            with kv.defer_pushpulls():
                original(self)
        else:
            original(self)
    _allreduce_grads._ps_patched = True
    trainer_cls._allreduce_grads = _allreduce_grads
