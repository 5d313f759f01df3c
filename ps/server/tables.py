"""Tables: a server's embedding tables (ps/embed): declarations, pulls, and pushes in rounds.

A push is one worker's gradient rows for the ids of this server's share (in chunks when
large; the entry's ``total`` counts its rows). Under ``sync`` a table's round ``seq`` (the
worker's count of pushes to the table) closes once every worker still in the job pushed to
it, in order: the pushes' rows are summed per id, divided by the workers that pushed (the
mean, as DistributedOptimizer averages dense gradients: one process on the whole batch),
and applied by the table's optimizer in one step; then every push of the round is answered,
so a worker's next pull sees the update. Under ``async`` each push is applied, as it is,
once all its chunks are in. A pull is answered at once, with rows made on first touch.

Tables are not replicated yet: a job with ``--max-restarts`` is refused at the declaration.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..embed.spec import TableSpec
from ..embed.table import RowTable, chunk_from_wire, chunk_to_wire, sum_rows
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


@dataclass
class _Served:
    spec: TableSpec
    rows: RowTable
    code: int
    rounds: dict[int, dict[int, _Push]] = field(default_factory=dict)   # seq -> worker -> push
    closed: int = 0                        # sync rounds closed (they close in order)
    exporting: np.ndarray | None = None    # the rows of the save under way (fixed at its first chunk)


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
        updated since the last save), and how many the save has in all."""
        served = self._named(body)
        start, count = int(body["start"]), int(body["count"])
        if start == 0 or served.exporting is None:
            served.exporting = served.rows.saved_rows(bool(body.get("changed")))
        rows = served.exporting[start:start + count]
        return {"total": len(served.exporting), **chunk_to_wire(served.rows.chunk(rows))}

    def saved(self, body: dict) -> None:
        served = self._named(body)
        served.exporting = None
        served.rows.saved()

    def put(self, body: dict) -> int:
        served = self._named(body)
        served.rows.put(chunk_from_wire(body, served.spec, served.rows.widths))
        return len(served.rows)

    def stats(self) -> dict[str, dict[str, int]]:
        return {t.spec.name: {"rows": len(t.rows), "steps": t.rows.steps} for t in self.tables.values()}

    # -- requests --------------------------------------------------------------------------
    def handle(self, sender: int, entry: Entry, data: Rows) -> list[Reply]:
        try:
            served = self._served(entry)
            if entry.op & Op.PUSH:
                return self._push(served, sender, entry, data)
            values = served.rows.lookup(data.ids)
            n = values.size
            return [Reply(sender, Entry(entry.ts, entry.op, entry.key, 0, n, n, entry.dtype_code, None,
                                        entry.row_len, entry.seq), values.reshape(-1))]
        except TableError as exc:
            return [Reply(sender, entry.failed(exc.kind, f"{self.name}: {exc}"), None)]

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
        if served.spec.consistency == "async":
            del pushes[sender]
            if not pushes:
                del served.rounds[entry.seq]
            if push.ids:
                served.rows.apply(*sum_rows(np.concatenate(push.ids), np.concatenate(push.grads)))
            return [Reply(sender, _answer(push), None)]
        return self._close_rounds(served)

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
        return replies

    def stalls(self, after: float) -> list[TableStall]:
        """Sync rounds that have waited ``after`` seconds or more since their first push and
        were not named yet (PS_STALL_WARNING): a worker that stopped pushing holds the others."""
        now, found = time.monotonic(), []
        needed = self._needed()
        for key, served in self.tables.items():
            pushes = served.rounds.get(served.closed + 1)
            if served.spec.consistency != "sync" or not pushes or (key, served.closed + 1) in self.warned:
                continue
            waited = now - min(p.came for p in pushes.values())
            if waited >= after:
                done = {w for w, p in pushes.items() if p.complete}
                stall = TableStall(served.spec.name, served.closed + 1, waited, tuple(sorted(needed - done)),
                                   tuple(sorted(done)))
                self.warned[(key, stall.round)] = stall
                found.append(stall)
        return found

    def resumed(self) -> list[TableStall]:
        """The stalls named before whose rounds have closed since."""
        over = [k for k in self.warned if k[0] not in self.tables or self.tables[k[0]].closed >= k[1]]
        return [self.warned.pop(k) for k in over]
