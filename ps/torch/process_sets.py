"""``ps.torch``'s process sets (ps/collective/process_sets.py, over ``runtime.job``), and ``hvd.init`` /
``hvd.shutdown``, which register and drop them."""
from __future__ import annotations

from typing import Any

from ..collective import process_sets
from ..collective.process_sets import Scope
from . import runtime


class ProcessSet(process_sets.ProcessSet):
    """Horovod's ``hvd.ProcessSet(ranks)`` of ``ps.torch``."""


sets = process_sets.ProcessSets(runtime.job, ProcessSet)
global_process_set = sets.global_set
scope = sets.scope
outside = sets.outside
barrier = sets.barrier
add_process_set = sets.add
remove_process_set = sets.remove
process_set_by_id = sets.by_id


def init(comm: Any = None, process_sets: Any = None, *, kvstore: str = "dist_sync") -> None:
    """``hvd.init``: join the job (``runtime.init``), then register ``process_sets`` in order."""
    runtime.init(comm, kvstore=kvstore)
    sets.register(process_sets)


def shutdown() -> None:
    """``hvd.shutdown``: leave the job; every process set but the global one is gone."""
    runtime.shutdown()
    sets.clear()


__all__ = ["ProcessSet", "Scope", "add_process_set", "barrier", "global_process_set", "init", "outside",
           "process_set_by_id", "remove_process_set", "scope", "shutdown"]
