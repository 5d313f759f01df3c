"""Tables: a server's embedding tables (ps/embed): declarations, pulls, and pushes in rounds.

A push is one worker's gradient rows for the ids of this server's share (in chunks when
large; the entry's ``total`` counts its rows). Under ``sync`` a table's round ``seq`` (the
worker's count of pushes to the table) closes once every worker still in the job pushed to
it, in order: the pushes' rows are summed per id, divided by the workers that pushed (the
mean, as DistributedOptimizer averages dense gradients: one process on the whole batch),
and applied by the table's optimizer in one step; then every push of the round is answered,
so a worker's next pull sees the update. Under ``async`` each push is applied, as it is,
once all its chunks are in. A pull is answered at once, with rows made on first touch; under
``ssp:S`` too, as soon as every worker has pushed at least c - S times, c being the puller's
own pushes so far (the entry's ``seq``); until then it waits here.

With a backup (``--max-restarts``), every change is journaled as the rows it left, with their
optimizer state (not the gradients: eviction and admission depend on lookups the backup
never sees), plus the ids evicted; the backup's copy (``copy=True``) replays them into a
table of its own, and a restarted server gets its tables back from that copy (``replay``
of its ``snapshot``). A push resent to the restart, or replayed by a restarted worker, is
answered and not applied twice: a sync round by the rounds closed, an async push by the
worker's pushes applied.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Collection, NamedTuple

import numpy as np

from ..embed.limits import Limits
from ..embed.spec import TableSpec
from ..embed.table import (
    RowTable,
    chunk_from_wire,
    chunk_to_wire,
    rows_per_chunk,
    sum_rows,
)
from ..frames import DTYPES, Rows, dtype_code
from ..message import Entry, Op, worker_id
from . import tablejournal
from .events import Event
from .rounds import Reply
from .tablestate import Held, Push, Served

logger = logging.getLogger(__name__)


def _answer(push: Push) -> Entry:
    e = push.entry
    return Entry(e.ts, e.op, e.key, 0, 0, e.total, e.dtype_code, None, e.row_len, e.seq)


class TableStall(NamedTuple):
    """A table's sync round that has waited long for some workers: what the warning names."""

    table: str
    round: int
    waited: float
    missing: tuple[int, ...]
    waiting: tuple[int, ...]
    what: str = "sync round"        # or an ssp table's "pull at step": what waits


class TableError(Exception):
    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind = kind


def _no_journal() -> None:
    return None


def _no_joins() -> Collection[int]:
    return ()


def _first_after(order: np.ndarray, ids: np.ndarray, after: int) -> int:
    """Where in ``order`` (row numbers in id order) the first row whose id is above ``after``
    is: a binary search through the row numbers (bisect's ``key=`` needs Python 3.10)."""
    lo, hi = 0, len(order)
    while lo < hi:
        mid = (lo + hi) // 2
        if ids[order[mid]] <= after:
            lo = mid + 1
        else:
            hi = mid
    return lo


class Tables:
    """``journal``: where changes go for the backup (the Store's list, None without one);
    ``joined``: the workers in Horovod's join (the Store's, ps/server/events.py's Joins);
    ``copy``: this is a backup's copy, which follows its primary's evictions instead of
    evicting by its own limits."""

    def __init__(self, num_workers: int, journal: Callable[[], list[Event] | None] = _no_journal,
                 copy: bool = False, joined: Callable[[], Collection[int]] = _no_joins):
        self.num_workers = num_workers
        self.name = "server"
        self.tables: dict[int, Served] = {}
        self.closed_workers: set[int] = set()
        self.warned: dict[tuple[int, int], TableStall] = {}     # (table key, round) -> the stall named
        self._journal, self._copy, self._joined = journal, copy, joined
        self._queue = tablejournal.CopyQueue(self._apply)     # a copy's events, applied in slices

    # -- declarations ------------------------------------------------------------------
    def declare(self, body: dict) -> dict:
        spec = TableSpec.from_wire(body.get("spec"))
        served = self.tables.get(spec.key)
        if served is not None:
            problem = served.spec.mismatch(spec)
            if problem:
                raise ValueError(problem)
        else:
            served = self._add(spec)
            self._record(Event("tdeclare", spec.key, 0, spec.to_wire()))
        return {"rows": len(served.rows)}

    def _add(self, spec: TableSpec) -> Served:
        rows = RowTable(dataclasses.replace(spec, limits=Limits()) if self._copy else spec)
        if not self._copy:
            rows.gone = []
        served = self.tables[spec.key] = Served(spec, rows, dtype_code(spec.np_dtype))
        return served

    # -- the backup's journal ----------------------------------------------------------------
    def _record(self, event: Event) -> None:
        journal = self._journal()
        if journal is not None:
            journal.append(event)

    def _changed(self, served: Served, ids: np.ndarray | None = None, worker: int = -1, seq: int = 0) -> None:
        """Journal what a change left (tablejournal.changed); without a backup, forget it."""
        journal = self._journal()
        events = tablejournal.changed(served, ids, worker, seq)
        if journal is not None:
            journal.extend(events)

    def snapshot(self) -> list[Event]:
        """Every table as events :meth:`replay` reads (tablejournal.snapshot)."""
        self.settle()
        return tablejournal.snapshot(self.tables)

    def replay(self, ev: Event) -> None:
        """Apply one journaled or snapshot event (a restart's own tables), or queue it (a
        backup's copy: :meth:`work`, :meth:`settle`)."""
        if self._copy:
            self._queue.put(ev)
        else:
            self._apply(ev)

    def work(self, seconds: float) -> None:
        """A copy: apply queued events after a replica message (tablejournal.CopyQueue.work)."""
        self._queue.work(seconds)

    def settle(self) -> None:
        """A copy: apply every queued event (before it is handed over or read)."""
        self._queue.settle()

    @property
    def backlog(self) -> int:
        """A copy's events queued, not yet applied."""
        return len(self._queue)

    def _apply(self, ev: Event) -> None:
        tablejournal.apply(self.tables, self._add, ev, self._copy)

    def nbytes(self) -> int:
        self.settle()
        return sum(t.rows.values[:len(t.rows)].nbytes for t in self.tables.values())

    def pushed(self, worker: int) -> dict[int, int]:
        """Per table, the pushes of ``worker`` held whole: where a restarted worker resumes."""
        out = {}
        for key, served in self.tables.items():
            if served.spec.consistency == "sync":
                push = served.rounds.get(served.closed + 1, {}).get(worker)
                out[key] = served.closed + (1 if push is not None and push.complete else 0)
            else:
                out[key] = served.clocks.get(worker, 0)
        return out

    # -- checkpoints (ps/embed/checkpoint.py drives them from a worker) ------------------------
    def _named(self, body: dict) -> Served:
        served = self.tables.get(TableSpec.key_of(body.get("name")))
        if served is None:
            raise KeyError(f"no embedding table {body.get('name')!r} here: declare it first (KVStore.table)")
        return served

    def export(self, body: dict) -> dict:
        """The next chunk of a save: the rows whose ids come after ``after`` (from the first
        when it is None) in id order, every row or with ``changed`` those updated since the last
        save, at most a chunk's worth; ``more``: rows remain after it. By id, not by row
        number: a server restarted in the middle of a save holds the same rows in another
        order, and goes on from the last id the worker got with neither a row twice nor one
        missed."""
        served = self._named(body)
        after, count = body.get("after"), min(int(body["count"]), rows_per_chunk(served.spec))
        rows = served.rows
        if after is None or served.exporting is None:
            served.exporting = None                             # an abandoned save's rows go first
            if after is None or served.save_began is None:      # a new save (else a restart goes on)
                served.save_began = rows.changes
                self._record(Event("tsavebegin", served.spec.key, 0, served.save_began))
            saved = rows.saved_rows(bool(body.get("changed")))
            served.exporting = saved[np.argsort(rows.ids[saved])]
            rows.hold_evictions = True      # until saved(): the row numbers must stay
        order = served.exporting
        first = 0 if after is None else _first_after(order, rows.ids, int(after))
        part = order[first:first + count]
        return {"total": len(order), "more": first + len(part) < len(order), **chunk_to_wire(rows.chunk(part))}

    def saved(self, body: dict) -> None:
        """The save under way ended: written whole (``completed``, the default), so the next
        incremental save holds the rows updated since it began, or abandoned. Either way rows
        may be evicted again."""
        served = self._named(body)
        completed = bool(body.get("completed", True))
        served.exporting = None
        served.rows.hold_evictions = False
        if completed and served.save_began is not None:
            served.rows.saved(served.save_began)
        self._record(Event("tsaved", served.spec.key, 0, [served.save_began, completed]))
        served.save_began = None

    def put(self, body: dict) -> int:
        served = self._named(body)
        chunk = chunk_from_wire(body, served.spec, served.rows.widths)
        served.rows.put(chunk)
        names = sorted(chunk.state)
        self._changed(served)
        self._record(Event("tput", served.spec.key, 0, [names, chunk.steps],
                           (chunk.ids, chunk.values.reshape(-1), *(chunk.state[k].reshape(-1) for k in names))))
        return len(served.rows)

    def stats(self) -> dict[str, dict[str, int]]:
        """Per table: rows held, steps, and what the limits did (KVStore.server_command("stats"))."""
        return {t.spec.name: {"rows": len(t.rows), "steps": t.rows.steps, "created": t.rows.rows_created,
                              "evicted": t.rows.evicted, "not_admitted": t.rows.not_admitted,
                              "dropped": t.rows.dropped} for t in self.tables.values()}

    # -- requests --------------------------------------------------------------------------
    def handle(self, sender: int, entry: Entry, data: Rows) -> list[Reply]:
        try:
            served = self._served(entry)
            if entry.op & Op.PUSH:
                return self._push(served, sender, entry, data)
            if served.spec.staleness is not None and not self._fresh_enough(served, entry.seq):
                served.held.append(Held(sender, entry, data, time.monotonic()))
                return []
            return [self._rows(served, sender, entry, data)]
        except TableError as exc:
            return [Reply(sender, entry.failed(exc.kind, f"{self.name}: {exc}"), None)]

    def _rows(self, served: Served, sender: int, entry: Entry, data: Rows) -> Reply:
        values = served.rows.lookup(data.ids)
        if served.rows.gone:
            self._changed(served)             # rows made for this pull pushed others out
        width = entry.row_len     # the request counts rows, the reply elements
        return Reply(sender, Entry(entry.ts, entry.op, entry.key, entry.offset * width, values.size,
                                   entry.total * width, entry.dtype_code, None, width, entry.seq), values.reshape(-1))

    def _fresh_enough(self, served: Served, clock: int) -> bool:
        """ssp: whether every worker still in the job has pushed ``clock - S`` times."""
        floor = clock - served.spec.staleness
        return all(served.clocks.get(w, 0) >= floor for w in self._needed())

    def _release(self, served: Served) -> list[Reply]:
        """ssp: answer the held pulls the slowest worker's progress now allows."""
        ready, keep = [], []
        for held in served.held:
            (ready if self._fresh_enough(served, held.entry.seq) else keep).append(held)
        served.held = keep
        return [self._rows(served, h.sender, h.entry, h.data) for h in ready]

    def _served(self, entry: Entry) -> Served:
        served = self.tables.get(entry.key)
        if served is None:
            raise TableError("KeyError", f"no embedding table with key {entry.key}: declare it first "
                                         "(KVStore.table)")
        if entry.row_len != served.spec.dim:
            raise TableError("ValueError", f"table {served.spec.name!r} has dimension {served.spec.dim}, "
                                           f"the request {entry.row_len}")
        if entry.dtype_code != served.code:
            raise TableError("TypeError", f"table {served.spec.name!r} holds {served.spec.dtype}, "
                                          f"the request {DTYPES[entry.dtype_code]}")
        return served

    def _push(self, served: Served, sender: int, entry: Entry, data: Rows) -> list[Reply]:
        sync = served.spec.consistency == "sync"
        if entry.seq <= (served.closed if sync else served.clocks.get(sender, 0)):
            # resent to a restarted server, or replayed by a restarted worker: applied already
            last = entry.offset + entry.length >= entry.total
            return [Reply(sender, _answer(Push(entry)), None)] if last else []
        pushes = served.rounds.setdefault(entry.seq, {})
        push = pushes.get(sender)
        if push is not None and entry.offset == 0:
            if push.complete:
                # its dead self pushed this round whole; the round answers this one at its close
                if sync:
                    push.entry = entry
                return []
            push = None             # sent again from its start: the part that came is dropped
        if push is None:
            push = pushes[sender] = Push(entry)
        elif push.complete:
            return []
        if len(data.ids):
            push.ids.append(data.ids)
            push.grads.append(data.values.reshape(len(data.ids), served.spec.dim))
        push.rows += entry.length
        if not push.complete:
            return []
        if served.spec.consistency == "sync":
            return self._close_rounds(served)
        del pushes[sender]                  # async and ssp: applied now, as it is
        if not pushes:
            del served.rounds[entry.seq]
        # no rows (this worker's batch had no ids here): still journaled, with none, since
        # the push moved its clock, which a restart restored from the copy must know (an
        # ssp pull waits on it)
        uids = np.empty(0, np.int64)
        if push.ids:
            uids, sums = sum_rows(np.concatenate(push.ids), np.concatenate(push.grads))
            served.rows.apply(uids, sums)
        served.clocks[sender] = max(served.clocks.get(sender, 0), entry.seq)
        self._changed(served, uids, sender, entry.seq)
        replies = [Reply(sender, _answer(push), None)]
        if served.spec.staleness is not None:
            replies += self._release(served)
        return replies

    def _needed(self) -> set[int]:
        """The workers a sync round waits for and an ssp pull's staleness counts: not those
        that closed their stores, nor those in Horovod's join (their share of a round is zero
        until they leave it; then they skip the rounds closed meanwhile: :meth:`progress`)."""
        return {worker_id(r) for r in range(self.num_workers)} - self.closed_workers - set(self._joined())

    def _close_rounds(self, served: Served) -> list[Reply]:
        """Close the table's sync rounds that every worker still in the job pushed to, in order."""
        replies: list[Reply] = []
        needed = self._needed()
        while True:
            pushes = served.rounds.get(served.closed + 1)
            if not pushes or not needed <= {w for w, p in pushes.items() if p.complete}:
                return replies
            del served.rounds[served.closed + 1]
            served.closed += 1
            # by worker, not by arrival: float sums of three or more rows of one id depend on
            # their order, and a round must sum alike in every run (a restart's redo included)
            ranked = [pushes[w] for w in sorted(pushes)]
            ids = [a for p in ranked for a in p.ids]
            if ids:
                uids, sums = sum_rows(np.concatenate(ids), np.concatenate([g for p in ranked for g in p.grads]))
                # the mean over the workers that pushed and those in the join (their share zero,
                # as Horovod's allreduce counts a joined rank)
                joined = len(set(self._joined()) - set(pushes) - self.closed_workers)
                served.rows.apply(uids, sums / np.asarray(len(pushes) + joined, sums.dtype))
            else:
                uids = np.empty(0, np.int64)
                served.rows.apply(uids, np.empty((0, served.spec.dim), served.rows.values.dtype))
            self._changed(served, uids)
            replies += [Reply(w, _answer(p), None) for w, p in pushes.items()]

    def worker_joined(self) -> list[Reply]:
        """A worker is in Horovod's join: rounds that wait only for workers in it close, and
        ssp pulls held for their progress are answered."""
        return self._go_on()

    def worker_left(self, worker: int) -> list[Reply]:
        """``worker`` leaves the join: in an async or ssp table its clock moves to the most
        pushes any worker made (its next push is numbered after them, :meth:`progress`), so an
        ssp pull, its own included, does not wait for the pushes it skipped."""
        replies: list[Reply] = []
        for served in self.tables.values():
            if served.spec.consistency == "sync":
                continue
            top = max(served.clocks.values(), default=0)
            if served.clocks.get(worker, 0) < top:
                served.clocks[worker] = top
                self._changed(served, np.empty(0, np.int64), worker, top)     # the copy's clock too
            if served.spec.staleness is not None:
                replies += self._release(served)
        return replies

    def progress(self) -> list[list[int]]:
        """Per table, [key, rounds]: its sync rounds closed, or the most pushes of a worker
        applied (async, ssp). A worker leaving the join skips to it, so its next push counts
        after the rounds the others made meanwhile (none are in flight: every worker joined)."""
        out = []
        for key, served in self.tables.items():
            rounds = served.closed if served.spec.consistency == "sync" else max(served.clocks.values(), default=0)
            out.append([key, rounds])
        return out

    def worker_closed(self, worker: int) -> list[Reply]:
        """A worker closed its store: rounds that had all but its push close without it; a
        round it had pushed to is closed with the others' (its share is in)."""
        self.closed_workers.add(worker)
        return self._go_on()

    def _go_on(self) -> list[Reply]:
        replies: list[Reply] = []
        for served in self.tables.values():
            if served.spec.consistency == "sync":
                replies += self._close_rounds(served)
            elif served.spec.staleness is not None:
                replies += self._release(served)
        return replies

    def stalls(self, after: float) -> list[TableStall]:
        """Rounds that have waited ``after`` seconds or more and were not named yet
        (PS_STALL_WARNING): a sync round since its first push, an ssp pull since it came. A
        worker that stopped pushing holds the others."""
        now, found = time.monotonic(), []
        needed = self._needed()
        for key, served in self.tables.items():
            if served.spec.consistency == "sync":
                pushes = served.rounds.get(served.closed + 1)
                if not pushes:
                    continue
                rnd, since = served.closed + 1, min(p.came for p in pushes.values())
                done = {w for w, p in pushes.items() if p.complete}
                missing, waiting = needed - done, done
            elif served.held:
                oldest = min(served.held, key=lambda h: h.came)
                rnd, since = oldest.entry.seq, oldest.came
                floor = rnd - served.spec.staleness
                missing = {w for w in needed if served.clocks.get(w, 0) < floor}
                waiting = {h.sender for h in served.held if h.entry.seq == rnd}
            else:
                continue
            if (key, rnd) in self.warned or now - since < after:
                continue
            stall = TableStall(served.spec.name, rnd, now - since, tuple(sorted(missing)), tuple(sorted(waiting)),
                               "sync round" if served.spec.consistency == "sync" else "ssp pull at step")
            self.warned[(key, rnd)] = stall
            found.append(stall)
        return found

    def resumed(self) -> list[TableStall]:
        """The stalls named before that are over: the round closed, or no pull waits at that clock."""
        over = [k for k in self.warned if not self._waiting(k)]
        return [self.warned.pop(k) for k in over]

    def _waiting(self, warned: tuple[int, int]) -> bool:
        served = self.tables.get(warned[0])
        if served is None:
            return False
        if served.spec.consistency == "sync":
            return served.closed < warned[1]
        return any(h.entry.seq == warned[1] for h in served.held)
