"""Horovod's process sets, as far as ps has them: the global one.

Horovod scripts pass ``process_set=hvd.global_process_set`` explicitly at times, so every
collective takes the argument; a subset of the workers would need sync rounds over part of
the job, which ps's servers do not have, so any other set is refused by name.
"""
from __future__ import annotations

from typing import Any, Sequence

from . import runtime


class ProcessSet:
    """A set of ranks. Only ``global_process_set`` (every worker) can be used."""

    def __init__(self, ranks: Sequence[int] | None = None) -> None:
        self._ranks = None if ranks is None else sorted(int(r) for r in ranks)
        self.process_set_id = 0 if ranks is None else None

    @property
    def ranks(self) -> list[int]:
        return list(range(runtime.size())) if self._ranks is None else list(self._ranks)

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        return self.ranks.index(runtime.rank())

    def included(self) -> bool:
        return runtime.rank() in self.ranks

    def __str__(self) -> str:
        return "ProcessSet(global)" if self._ranks is None else f"ProcessSet(ranks={self._ranks})"


global_process_set = ProcessSet()


def check(process_set: Any) -> None:
    """Refuse any set but the global one (None means the global one)."""
    if process_set is None or process_set is global_process_set:
        return
    raise ValueError(f"process_set {process_set} is not supported: ps.torch runs every collective over all "
                     "workers (hvd.global_process_set)")


def barrier(process_set: Any = None) -> None:
    """Wait for every worker of ``process_set`` (the global one) to get here."""
    check(process_set)
    runtime.join()


def add_process_set(process_set: Any) -> ProcessSet:
    raise NotImplementedError(f"add_process_set({process_set!r}): ps.torch has no process sets other than "
                              "hvd.global_process_set")


def remove_process_set(process_set: Any) -> bool:
    raise NotImplementedError(f"remove_process_set({process_set!r}): ps.torch has no process sets other than "
                              "hvd.global_process_set")
