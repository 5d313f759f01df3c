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

Tables are not replicated yet: a job with ``--max-restarts`` is refused at the declaration.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..embed.spec import TableSpec
from ..embed.table import RowTable, chunk_from_wire, chunk_to_wire, rows_per_chunk, sum_rows
from ..message import DTYPES, Entry, Op, Rows, dtype_code, worker_id
from .rounds import Reply

logger = logging.getLogger(__name__)


@dataclass
class _Push:
    """One worker's push to one round, as its chunks come."""

    entry: Entry                           # its first chunk: what the answer names
    ids: list[np.ndarray] = field(default_factory=list)
    grads: list[np.ndarray] = field(default_factory=list)
    rows: int = 0
    came: float = field(default_factory=time.monotonic)

    @property
    def complete(self) -> bool:
        return self.rows >= self.entry.total


class _Held(NamedTuple):
    """An ssp pull that waits until the slowest worker is close enough."""

    sender: int
    entry: Entry
    data: Rows
    came: float


@dataclass
class _Served:
    spec: TableSpec
    rows: RowTable
    code: int
    rounds: dict[int, dict[int, _Push]] = field(default_factory=dict)   # seq -> worker -> push
    closed: int = 0                        # sync rounds closed (they close in order)
    exporting: np.ndarray | None = None    # the rows of the save under way (fixed at its first chunk)
    clocks: dict[int, int] = field(default_factory=dict)     # ssp: worker -> its pushes applied
    held: list[_Held] = field(default_factory=list)           # ssp: pulls of workers too far ahead


def _answer(push: _Push) -> Entry:
    e = push.entry
    return Entry(e.ts, e.op, e.key, 0, 0, e.total, e.dtype_code, None, e.row_len, e.seq)


class TableStall(NamedTuple):
    """A table's sync round that has waited long for some workers: what the warning names."""

    table: str
    round: int
    waited: float
    missing: tuple[int, ...]
    waiting: tuple[int, ...]


class TableError(Exception):
    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind = kind


class Tables:
    def __init__(self, num_workers: int, replicated: bool = False):
        self.num_workers = num_workers
        self.replicated = replicated
        self.name = "server"
        self.tables: dict[int, _Served] = {}
        self.closed_workers: set[int] = set()
        self.warned: dict[tuple[int, int], TableStall] = {}     # (table key, round) -> the stall named

    # -- declarations ------------------------------------------------------------------
    def declare(self, body: dict) -> dict:
        spec = TableSpec.from_wire(body.get("spec"))
        if self.replicated:
            raise NotImplementedError(f"table {spec.name!r}: embedding tables are not replicated yet, so a job "
                                      "with --max-restarts (PS_MAX_RESTARTS > 0) cannot hold one; run without it")
        served = self.tables.get(spec.key)
        if served is not None:
            problem = served.spec.mismatch(spec)
            if problem:
                raise ValueError(problem)
        else:
            served = self.tables[spec.key] = _Served(spec, RowTable(spec), dtype_code(spec.np_dtype))
        return {"rows": len(served.rows)}

    # -- checkpoints (ps/embed/checkpoint.py drives them from a worker) ------------------------
    def _named(self, body: dict) -> _Served:
        served = self.tables.get(TableSpec.key_of(body.get("name")))
        if served is None:
            raise KeyError(f"no embedding table {body.get('name')!r} here: declare it first (KVStore.table)")
        return served

    def export(self, body: dict) -> dict:
        """Rows ``start`` .. ``start + count`` of a save (every row, or with ``changed`` those
        updated since the last save; at most a chunk's worth), and how many the save has in all."""
        served = self._named(body)
        start, count = int(body["start"]), min(int(body["count"]), rows_per_chunk(served.spec))
        if start == 0 or served.exporting is None:
            served.exporting = served.rows.saved_rows(bool(body.get("changed")))
            served.rows.hold_evictions = True      # until saved(): the row numbers must stay
        rows = served.exporting[start:start + count]
        return {"total": len(served.exporting), **chunk_to_wire(served.rows.chunk(rows))}

    def saved(self, body: dict) -> None:
        served = self._named(body)
        served.exporting = None
        served.rows.hold_evictions = False
        served.rows.saved()

    def put(self, body: dict) -> int:
        served = self._named(body)
        served.rows.put(chunk_from_wire(body, served.spec, served.rows.widths))
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
                served.held.append(_Held(sender, entry, data, time.monotonic()))
                return []
            return [self._rows(served, sender, entry, data)]
        except TableError as exc:
            return [Reply(sender, entry.failed(exc.kind, f"{self.name}: {exc}"), None)]

    @staticmethod
    def _rows(served: _Served, sender: int, entry: Entry, data: Rows) -> Reply:
        values = served.rows.lookup(data.ids)
        width = entry.row_len     # the request counts rows, the reply elements
        return Reply(sender, Entry(entry.ts, entry.op, entry.key, entry.offset * width, values.size,
                                   entry.total * width, entry.dtype_code, None, width, entry.seq), values.reshape(-1))

    def _fresh_enough(self, served: _Served, clock: int) -> bool:
        """ssp: whether every worker still in the job has pushed ``clock - S`` times."""
        floor = clock - served.spec.staleness
        return all(served.clocks.get(w, 0) >= floor for w in self._needed())

    def _release(self, served: _Served) -> list[Reply]:
        """ssp: answer the held pulls the slowest worker's progress now allows."""
        ready, keep = [], []
        for held in served.held:
            (ready if self._fresh_enough(served, held.entry.seq) else keep).append(held)
        served.held = keep
        return [self._rows(served, h.sender, h.entry, h.data) for h in ready]

    def _served(self, entry: Entry) -> _Served:
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

    def _push(self, served: _Served, sender: int, entry: Entry, data: Rows) -> list[Reply]:
        if served.spec.consistency == "sync" and entry.seq <= served.closed:
            return [Reply(sender, _answer(_Push(entry)), None)]     # a resend of a round already applied
        pushes = served.rounds.setdefault(entry.seq, {})
        push = pushes.get(sender)
        if push is None:
            push = pushes[sender] = _Push(entry)
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
        if push.ids:
            served.rows.apply(*sum_rows(np.concatenate(push.ids), np.concatenate(push.grads)))
        replies = [Reply(sender, _answer(push), None)]
        if served.spec.staleness is not None:
            served.clocks[sender] = max(served.clocks.get(sender, 0), entry.seq)
            replies += self._release(served)
        return replies

    def _needed(self) -> set[int]:
        return {worker_id(r) for r in range(self.num_workers)} - self.closed_workers

    def _close_rounds(self, served: _Served) -> list[Reply]:
        """Close the table's sync rounds that every worker still in the job pushed to, in order."""
        replies: list[Reply] = []
        needed = self._needed()
        while True:
            pushes = served.rounds.get(served.closed + 1)
            if not pushes or not needed <= {w for w, p in pushes.items() if p.complete}:
                return replies
            del served.rounds[served.closed + 1]
            served.closed += 1
            ids = [a for p in pushes.values() for a in p.ids]
            if ids:
                uids, sums = sum_rows(np.concatenate(ids), np.concatenate([g for p in pushes.values() for g in p.grads]))
                served.rows.apply(uids, sums / np.asarray(len(pushes), sums.dtype))
            else:
                served.rows.apply(np.empty(0, np.int64), np.empty((0, served.spec.dim), served.rows.values.dtype))
            replies += [Reply(w, _answer(p), None) for w, p in pushes.items()]

    def worker_closed(self, worker: int) -> list[Reply]:
        """A worker closed its store: rounds that had all but its push close without it; a
        round it had pushed to is closed with the others' (its share is in)."""
        self.closed_workers.add(worker)
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
            stall = TableStall(served.spec.name, rnd, now - since, tuple(sorted(missing)), tuple(sorted(waiting)))
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
