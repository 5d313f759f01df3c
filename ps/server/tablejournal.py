"""An embedding table's changes as a backup gets them, and how they are applied: the events a
change journals (the rows it left, with their optimizer state, and the ids evicted), a table
as the events of a snapshot, and the replay of either into a copy or a restart's own tables.
A backup's copy queues them (``CopyQueue``) and applies them a little after each replica
message, since a snapshot of 10^7 rows takes seconds and the server's I/O thread must not sit
on it."""
from __future__ import annotations

import collections
import time
from typing import Callable

import numpy as np

from ..embed.spec import TableSpec
from ..embed.table import Chunk, rows_per_chunk
from ..errors import ProtocolError
from .events import Event
from .tablestate import Served

SNAPSHOT_KINDS = ("tdata", "tstate")       # a snapshot's rows and counts: they make a backlog


def changed(served: Served, ids: np.ndarray | None, worker: int, seq: int) -> list[Event]:
    """What a change left: the ids evicted, then the rows of ``ids`` (updated), with the
    worker's push that made it (``worker`` -1: a sync round's close)."""
    rows, events = served.rows, []
    gone, rows.gone = rows.gone, []
    if gone:
        events.append(Event("tevict", served.spec.key, 0, None, (np.concatenate(gone),)))
    if ids is not None:
        names = sorted(rows.state)
        chunk = rows.chunk_of(ids)
        events.append(Event("trows", served.spec.key, 0, [served.closed, worker, seq, chunk.steps, names,
                                                          rows.changes],
                            (chunk.ids, chunk.values.reshape(-1), *(chunk.state[k].reshape(-1) for k in names))))
    return events


def snapshot(tables: dict[int, Served]) -> list[Event]:
    """Every table as events :func:`apply` reads: its declaration, its counts, and its rows in
    chunks of a checkpoint's size (a message each)."""
    events = []
    for key, served in tables.items():
        rows, names = served.rows, sorted(served.rows.state)
        events.append(Event("tdeclare", key, 0, served.spec.to_wire()))
        events.append(Event("tstate", key, 0, [served.closed, [[w, n] for w, n in served.clocks.items()],
                                              rows.steps, len(rows), rows.changes, rows.saved_at,
                                              served.save_began]))
        n, step = len(rows), rows_per_chunk(served.spec)
        for start in range(0, n, step):
            part = np.arange(start, min(n, start + step))
            chunk = rows.chunk(part)
            events.append(Event("tdata", key, 0, [names, chunk.steps],
                                (chunk.ids, chunk.values.reshape(-1), rows.updated[part],
                                 *(chunk.state[k].reshape(-1) for k in names))))
    return events


def apply(tables: dict[int, Served], add: Callable[[TableSpec], Served], ev: Event, copy: bool) -> None:
    """One journaled or snapshot event into ``tables`` (``add`` declares a new one); ``copy``:
    they are a backup's copy, not a restart's own tables."""
    if ev.kind == "tdeclare":
        spec = TableSpec.from_wire(ev.info)
        if spec.key not in tables:
            add(spec)
        return
    served = tables.get(ev.key)
    if served is None:
        raise ProtocolError(f"replica event {ev.kind} for embedding table {ev.key}, which no earlier event "
                            "declared here")
    rows = served.rows
    if ev.kind == "trows":
        closed, worker, seq, steps, names, changes = ev.info
        ids, values, *state = ev.arrays
        rows.put(_chunk(served, ids, values, names, state, steps), updated=int(changes), evict=False)
        served.closed = max(served.closed, int(closed))
        if worker >= 0:
            served.clocks[worker] = max(served.clocks.get(worker, 0), int(seq))
    elif ev.kind == "tdata":
        names, steps = ev.info
        ids, values, updated, *state = ev.arrays
        rows.put(_chunk(served, ids, values, names, state, steps), updated=updated.astype(np.uint64), evict=False)
    elif ev.kind == "tstate":
        closed, clocks, steps, count, changes, saved_at, save_began = ev.info
        served.closed, rows.steps = int(closed), int(steps)
        rows.changes, rows.saved_at = int(changes), int(saved_at)
        served.save_began = None if save_began is None else int(save_began)
        if not copy:        # a restart in the middle of a save holds evictions, as its primary did
            rows.hold_evictions = served.save_began is not None
        rows.reserve(len(rows) + int(count))
        served.clocks = {int(w): int(n) for w, n in clocks}
    elif ev.kind == "tevict":
        rows.remove(ev.arrays[0])
    elif ev.kind == "tsavebegin":
        served.save_began = int(ev.info)
    elif ev.kind == "tsaved":
        began, completed = ev.info
        if completed and began is not None:
            rows.saved(began)
        served.save_began = None
    elif ev.kind == "tput":
        names, steps = ev.info
        ids, values, *state = ev.arrays
        rows.put(_chunk(served, ids, values, names, state, steps), evict=False)     # its evictions follow
    else:
        raise ProtocolError(f"unknown embedding table event {ev.kind!r}")
    if rows.gone:
        rows.gone = []      # replayed evictions: nothing to journal


class CopyQueue:
    """A backup's queued events, applied by ``work`` after each replica message, or all by
    ``settle`` (before the copy is handed over or read)."""

    def __init__(self, apply_one: Callable[[Event], None]):
        self._apply = apply_one
        self._pending: collections.deque[Event] = collections.deque()
        self._arrived = 0           # changes (not a snapshot's rows) queued since the last work()

    def put(self, ev: Event) -> None:
        self._pending.append(ev)
        self._arrived += ev.kind not in SNAPSHOT_KINDS

    def work(self, seconds: float) -> None:
        """Apply as many queued events as the primary's changes brought since the last call
        and one more, then more for about ``seconds``. So only a snapshot makes a backlog,
        which shrinks by an event and ``seconds`` of work per replica message; a primary's
        steady updates are applied as they come, however long they take (a budget alone let a
        round's rows that take longer than it to apply pile up here, round after round, in
        memory and in the settle before a handover)."""
        owed, self._arrived = self._arrived + 1, 0      # one more at least: a backlog always shrinks
        deadline = time.monotonic() + seconds
        while self._pending:
            self._apply(self._pending.popleft())
            owed -= 1
            if owed <= 0 and time.monotonic() >= deadline:
                return

    def settle(self) -> None:
        self._arrived = 0
        while self._pending:
            self._apply(self._pending.popleft())

    def __len__(self) -> int:
        return len(self._pending)


def _chunk(served: Served, ids: np.ndarray, values: np.ndarray, names: list, state: list, steps: int) -> Chunk:
    """A journal's or snapshot's rows as a Chunk, checked against the table."""
    n, widths = len(ids), served.rows.widths
    if sorted(names) != sorted(widths) or len(state) != len(names):
        raise ProtocolError(f"embedding table {served.spec.name!r}: the replica carries state {names}, "
                            f"the table keeps {sorted(widths)}")
    try:
        return Chunk(ids, values.reshape(n, served.spec.dim),
                     {k: a.reshape(n, widths[k]) for k, a in zip(names, state)}, int(steps))
    except ValueError as exc:
        raise ProtocolError(f"embedding table {served.spec.name!r}: malformed replica rows: {exc}") from None
