"""Horovod's process sets: collectives over some of the workers, for each adapter
(``ps.torch``, ``ps.mxnet``'s Horovod calls) over its own ``Job``.

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

import numpy as np

from ..errors import MismatchError
from .job import Job
from .names import group_key


class ProcessSet:
    """A set of ranks: pass it to ``hvd.init(process_sets=[...])`` or ``hvd.add_process_set``,
    then as ``process_set=`` to a collective its members run. Each adapter has its subclass,
    bound to its own sets (``ProcessSets``)."""

    sets: ProcessSets

    def __init__(self, ranks: Iterable[int] | None = None) -> None:
        self._ranks = None if ranks is None else _ranks(ranks, self.sets.job.api)
        self.process_set_id: int | None = 0 if ranks is None else None

    @property
    def ranks(self) -> list[int]:
        return list(range(self.sets.job.size())) if self._ranks is None else list(self._ranks)

    @property
    def is_global(self) -> bool:
        return self._ranks is None

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        """This worker's place in the set (-1 if it is not in it)."""
        me = self.sets.job.rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool:
        return self.sets.job.rank() in self.ranks

    def invalidate(self) -> None:
        self.process_set_id = None

    def __str__(self) -> str:
        if self._ranks is None:
            return "ProcessSet(global)"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self._ranks})"

    __repr__ = __str__


def _ranks(ranks: Any, api: str) -> list[int]:
    """``ranks`` as Horovod takes them (any iterable of ints), sorted; ValueError otherwise."""
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Iterable):
        raise ValueError(f"a ProcessSet is made of a list of ranks ({api} has no MPI communicators), "
                         f"got {ranks!r:.80}")
    items = list(ranks)
    try:
        if any(isinstance(r, bool) for r in items):
            raise TypeError("a bool is not a rank")
        return sorted(operator.index(r) for r in items)
    except TypeError:
        raise ValueError(f"a ProcessSet is made of int ranks, got {items!r:.80}") from None


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


def check_root(root_rank: Any, where: Scope, what: str) -> None:
    """``root_rank`` (a rank of the job, as in Horovod) must be one of ``where``'s."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) or root_rank not in where.ranks:
        if where.group:
            raise ValueError(f"{what}: root_rank {root_rank!r} is not in process set {where.group} (ranks "
                             f"{list(where.ranks)})")
        raise ValueError(f"{what}: root_rank {root_rank!r} is out of range for a job of {where.size} workers")


def root_vote(root_rank: int, me: int) -> np.ndarray:
    """This worker's share of a broadcast's root check: summed over the workers, (1, n x root)
    iff every one named the same root and it is one of them."""
    return np.array([1.0 if me == root_rank else 0.0, float(root_rank)])


def check_root_votes(total: Any, root_rank: int, me: int, where: Scope, what: str) -> None:
    """The summed ``root_vote``s: MismatchError, on every worker alike, unless they agree."""
    roots, named = (float(x) for x in total)
    if roots != 1 or named != where.size * root_rank:
        raise MismatchError(f"{what}: the workers disagree on root_rank (rank {me} named {root_rank}; "
                            f"{int(roots)} of {where.size} workers called themselves the root)")


class ProcessSets:
    """One adapter's process sets. Each adapter has its own (its own job numbers its groups),
    so a set made for one cannot be used with the other; ``ProcessSet`` objects are the
    user's handles, this is where they are resolved to a job's group."""

    def __init__(self, job: Job, cls: type[ProcessSet]) -> None:
        self.job, self.cls = job, cls
        cls.sets = self
        self.global_set = cls()
        self.registered: dict[int, list[ProcessSet]] = {0: [self.global_set]}

    def scope(self, process_set: Any = None) -> Scope:
        """The Scope of ``process_set`` (None: every worker; a Scope: itself). Raises ValueError
        for a set that is not registered (or was removed) and for one this worker is not in."""
        if isinstance(process_set, Scope):
            return process_set
        job = self.job
        if process_set is None or process_set is self.global_set:
            return Scope(0, tuple(range(job.size())), job.rank())
        if not isinstance(process_set, self.cls):     # another adapter's sets number other groups
            raise ValueError(f"process_set must be a {self.job.api} ProcessSet (hvd.add_process_set), got "
                             f"{process_set!r:.80}")
        gid = process_set.process_set_id
        if gid == 0:
            return self.scope(None)
        ranks = job.group_ranks(gid) if gid is not None else None
        if ranks is None:
            raise ValueError(f"{process_set} is not registered: pass it to hvd.init(process_sets=[...]) or "
                             "hvd.add_process_set() first (or it was removed)")
        me = job.rank()
        if me not in ranks:
            raise ValueError(f"rank {me} is not in {process_set}: only its members run its collectives")
        return Scope(gid, ranks, ranks.index(me))

    def outside(self, process_set: Any) -> bool:
        """``process_set`` is a registered set this worker is not in (Horovod's
        DistributedOptimizer of such a set trains this worker alone)."""
        if not isinstance(process_set, self.cls) or not process_set.process_set_id:
            return False
        ranks = self.job.group_ranks(process_set.process_set_id)
        return ranks is not None and self.job.rank() not in ranks

    def barrier(self, process_set: Any = None) -> None:
        """Wait for every worker of ``process_set`` (default: every worker) to get here."""
        where = self.scope(process_set)
        kv = self.job.store()
        if kv is None:
            return
        if where.group == 0:
            kv.barrier(wait=False)          # as Horovod's: operations in flight go on in flight
        else:
            self.job.meet(where.group, "barrier", f"the members of process set {where.group} are not all at a "
                                                  "barrier (another member is in another collective)")

    def add(self, process_set: ProcessSet | Sequence[int]) -> ProcessSet:
        """Register a process set (a collective over every worker, in the same order
        everywhere); returns it with its ``process_set_id``. Raises ValueError if a set of the
        same ranks exists."""
        if not isinstance(process_set, ProcessSet):
            process_set = self.cls(process_set)
        if process_set.is_global:
            raise ValueError("the global process set is registered already")
        if process_set.process_set_id is not None and self.job.group_ranks(process_set.process_set_id):
            raise ValueError(f"{process_set} is registered already")
        gid = self.job.add_group(process_set.ranks)
        process_set.process_set_id = gid
        self.registered[gid] = [process_set]
        return process_set

    def remove(self, process_set: ProcessSet) -> bool:
        """Unregister a process set (a collective over every worker); False for the global one
        or one not registered. The set and its equals are invalidated."""
        gid = getattr(process_set, "process_set_id", None)
        if not gid or self.job.group_ranks(gid) is None:
            return False
        self.job.remove_group(gid)
        for equal in self.registered.pop(gid, [process_set]):
            equal.invalidate()
        return True

    def by_id(self, process_set_id: int) -> ProcessSet:
        if process_set_id not in self.registered:
            raise ValueError(f"no process set with id {process_set_id}")
        return self.registered[process_set_id][0]

    def clear(self) -> None:
        """At ``hvd.shutdown``: every process set but the global one is gone."""
        for gid in [g for g in self.registered if g]:
            for each in self.registered.pop(gid):
                each.invalidate()

    def register(self, process_sets: Any) -> None:
        """``hvd.init(process_sets=...)``: a list of ProcessSets (or rank lists) to add, or
        "dynamic" (sets may be added later; ps always allows that)."""
        if process_sets is None or process_sets == "dynamic":
            return
        if isinstance(process_sets, (ProcessSet, str)) or not isinstance(process_sets, (list, tuple)):
            raise ValueError(f"process_sets must be a list of ProcessSets or \"dynamic\", got {process_sets!r:.80}")
        for each in process_sets:
            if isinstance(each, ProcessSet) and each.is_global:
                continue
            if isinstance(each, ProcessSet) and sorted(set(each.ranks)) == list(range(self.job.size())):
                each.process_set_id = 0
                self.registered[0].append(each)
                continue
            self.add(each)
