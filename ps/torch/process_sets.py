"""Horovod's process sets: collectives over some of the workers.

A process set is a group of ``ps.collective.Job``: its tensors travel under keys of their own
(``set<id>/...``) that only its members push, and the servers close their sync rounds when
those members pushed (``Store.set_members``). Adding and removing a set is a collective over
every worker, as in Horovod; using one involves its members only. ``Scope`` is what a
collective needs to know about where it runs: which keys, how many workers, which one this is.
"""
from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any, NamedTuple, Sequence

from ..collective import group_key
from . import runtime


class ProcessSet:
    """A set of ranks: pass it to ``hvd.init(process_sets=[...])`` or ``hvd.add_process_set``,
    then as ``process_set=`` to a collective its members run."""

    def __init__(self, ranks: Iterable[int] | None = None) -> None:
        self._ranks = None if ranks is None else _ranks(ranks)
        self.process_set_id: int | None = 0 if ranks is None else None

    @property
    def ranks(self) -> list[int]:
        return list(range(runtime.size())) if self._ranks is None else list(self._ranks)

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        """This worker's place in the set (-1 if it is not in it)."""
        me = runtime.rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool:
        return runtime.rank() in self.ranks

    def invalidate(self) -> None:
        self.process_set_id = None

    def __str__(self) -> str:
        if self._ranks is None:
            return "ProcessSet(global)"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self._ranks})"

    __repr__ = __str__


def _ranks(ranks: Any) -> list[int]:
    """``ranks`` as Horovod takes them (any iterable of ints), sorted; ValueError otherwise."""
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Iterable):
        raise ValueError(f"a ProcessSet is made of a list of ranks (ps.torch has no MPI communicators), "
                         f"got {ranks!r:.80}")
    items = list(ranks)
    try:
        if any(isinstance(r, bool) for r in items):
            raise TypeError("a bool is not a rank")
        return sorted(operator.index(r) for r in items)
    except TypeError:
        raise ValueError(f"a ProcessSet is made of int ranks, got {items!r:.80}") from None


global_process_set = ProcessSet()
_registered: dict[int, list[ProcessSet]] = {0: [global_process_set]}


class Scope(NamedTuple):
    """Where one collective runs: every worker (group 0) or a process set's members."""

    group: int
    ranks: tuple[int, ...]
    rank: int                   # this worker's place among ``ranks``

    @property
    def size(self) -> int:
        return len(self.ranks)

    def key(self, key: str) -> str:
        return group_key(self.group, key)


def scope(process_set: Any = None) -> Scope:
    """The Scope of ``process_set`` (None: every worker; a Scope: itself). Raises ValueError
    for a set that is not registered (or was removed) and for one this worker is not in."""
    if isinstance(process_set, Scope):
        return process_set
    if process_set is None or process_set is global_process_set:
        return Scope(0, tuple(range(runtime.size())), runtime.rank())
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be a ProcessSet (hvd.add_process_set), got {process_set!r:.80}")
    gid = process_set.process_set_id
    if gid == 0:
        return scope(None)
    ranks = runtime.job.group_ranks(gid) if gid is not None else None
    if ranks is None:
        raise ValueError(f"{process_set} is not registered: pass it to hvd.init(process_sets=[...]) or "
                         "hvd.add_process_set() first (or it was removed)")
    me = runtime.rank()
    if me not in ranks:
        raise ValueError(f"rank {me} is not in {process_set}: only its members run its collectives")
    return Scope(gid, ranks, ranks.index(me))


def outside(process_set: Any) -> bool:
    """``process_set`` is a registered set this worker is not in (Horovod's DistributedOptimizer
    of such a set trains this worker alone)."""
    if not isinstance(process_set, ProcessSet) or not process_set.process_set_id:
        return False
    ranks = runtime.job.group_ranks(process_set.process_set_id)
    return ranks is not None and runtime.rank() not in ranks


def barrier(process_set: Any = None) -> None:
    """Wait for every worker of ``process_set`` (default: every worker) to get here."""
    where = scope(process_set)
    kv = runtime.store()
    if kv is None:
        return
    if where.group == 0:
        kv.barrier(wait=False)          # as Horovod's: operations in flight go on in flight
    else:
        runtime.job.meet(where.group, "barrier", f"the members of process set {where.group} are not all at a "
                                                  "barrier (another member is in another collective)")


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set (a collective over every worker, in the same order
    everywhere); returns it with its ``process_set_id``. Raises ValueError if a set of the
    same ranks exists."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set._ranks is None:
        raise ValueError("the global process set is registered already")
    if process_set.process_set_id is not None and runtime.job.group_ranks(process_set.process_set_id):
        raise ValueError(f"{process_set} is registered already")
    gid = runtime.job.add_group(process_set.ranks)
    process_set.process_set_id = gid
    _registered[gid] = [process_set]
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (a collective over every worker); False for the global one
    or one not registered. The set and its equals are invalidated."""
    gid = getattr(process_set, "process_set_id", None)
    if not gid or runtime.job.group_ranks(gid) is None:
        return False
    runtime.job.remove_group(gid)
    for equal in _registered.pop(gid, [process_set]):
        equal.invalidate()
    return True


def process_set_by_id(process_set_id: int) -> ProcessSet:
    if process_set_id not in _registered:
        raise ValueError(f"no process set with id {process_set_id}")
    return _registered[process_set_id][0]


def init(comm: Any = None, process_sets: Any = None, *, kvstore: str = "dist_sync") -> None:
    """``hvd.init``: join the job (``runtime.init``), then register ``process_sets`` in order."""
    runtime.init(comm, kvstore=kvstore)
    register(process_sets)


def shutdown() -> None:
    """``hvd.shutdown``: leave the job; every process set but the global one is gone."""
    runtime.shutdown()
    for gid in [g for g in _registered if g]:
        for each in _registered.pop(gid):
            each.invalidate()


def register(process_sets: Any) -> None:
    """``hvd.init(process_sets=...)``: a list of ProcessSets (or rank lists) to add, or
    "dynamic" (sets may be added later; ps always allows that)."""
    if process_sets is None or process_sets == "dynamic":
        return
    if isinstance(process_sets, (ProcessSet, str)) or not isinstance(process_sets, (list, tuple)):
        raise ValueError(f"process_sets must be a list of ProcessSets or \"dynamic\", got {process_sets!r:.80}")
    for each in process_sets:
        if isinstance(each, ProcessSet) and each._ranks is None:
            continue
        if isinstance(each, ProcessSet) and sorted(set(each.ranks)) == list(range(runtime.size())):
            each.process_set_id = 0
            _registered[0].append(each)
            continue
        add_process_set(each)
