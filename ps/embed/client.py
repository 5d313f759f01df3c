"""A worker's embedding table: ``pull`` rows by id, ``push`` their gradients.

``Table`` talks to the servers: it declares the table on every server, cuts a request's ids
by the server that holds them (a hash of the id: ps/embed/hashing.py) and puts the rows
pulled back in the order asked. ``LocalTable`` is the same table in this process, for a
script that runs alone (no cluster): the same rows, the same optimizer, the same numbers.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from ..customer import Handle
from ..frames import dtype_code
from ..message import Op, server_id
from ..worker import KVWorker, TablePart
from .hashing import server_of
from .spec import TableSpec
from .table import Chunk, RowTable, chunk_from_wire, chunk_to_wire, rows_per_chunk




def check_ids(ids: Any, what: str) -> np.ndarray:
    """Ids as a 1-d int64 array, each once; TypeError/ValueError naming what is wrong."""
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what}: ids must be integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{what}: ids must fit in int64, got {int(arr.max())}")
    arr = np.ascontiguousarray(arr.reshape(-1), dtype=np.int64)
    # sorted ids (torch.unique's, the modules') are checked in one linear pass
    if len(arr) > 1 and not (arr[1:] > arr[:-1]).all() and len(np.unique(arr)) != len(arr):
        raise ValueError(f"{what}: ids must be distinct (deduplicate the batch's ids first)")
    return arr


def check_rows(rows: Any, n: int, spec: TableSpec, what: str) -> np.ndarray:
    arr = np.asarray(rows)
    if arr.shape != (n, spec.dim):
        raise ValueError(f"{what}: gradients of shape {arr.shape} for {n} ids; table {spec.name!r} "
                         f"wants ({n}, {spec.dim})")
    if arr.dtype != spec.np_dtype:
        raise TypeError(f"{what}: gradients of dtype {arr.dtype}; table {spec.name!r} holds {spec.dtype}")
    return np.ascontiguousarray(arr)


class Table:
    """An embedding table on the servers. Made by ``KVStore.table(spec)``, which declares it."""

    def __init__(self, spec: TableSpec, worker: KVWorker, num_servers: int):
        self.spec = spec
        self._worker, self._num_servers = worker, num_servers
        self._code = dtype_code(spec.np_dtype)
        self.payload_sent = self.payload_received = 0     # ids and rows, in bytes (the benchmark's count)

    @property
    def restarted(self) -> bool:
        """This worker replaces a dead one (``--max-restarts``) and re-runs its script."""
        return bool(self._worker.po.restarted)

    def _split(self, ids: np.ndarray) -> tuple[np.ndarray, list[TablePart]]:
        """The order that groups ``ids`` by server, and each server's part (all servers)."""
        owner = server_of(ids, self._num_servers)
        order = np.argsort(owner, kind="stable")
        bounds = np.searchsorted(owner[order], np.arange(self._num_servers + 1))
        parts = [TablePart(s, ids[order[bounds[s]:bounds[s + 1]]], None, int(bounds[s]))
                 for s in range(self._num_servers)]
        return order, parts

    def pull(self, ids: Any, block: bool = True, ahead: int = 0) -> np.ndarray | Handle:
        """The current rows of distinct ``ids`` (any int64; a row never touched is made,
        deterministically, on its server): shape (len(ids), dim). ``block=False``: a Handle
        whose ``wait()`` gives them; pulls started together leave as one message per server.
        ``ahead``: an ssp table answers as if this worker had pushed that many steps more (a
        prefetch for the next step)."""
        what = f"pull of table {self.spec.name!r}"
        ids = check_ids(ids, what)
        out = np.empty((len(ids), self.spec.dim), self.spec.np_dtype)
        if not len(ids):
            return _Done(out) if not block else out
        order, parts = self._split(ids)
        grouped = np.empty_like(out)
        parts = [p for p in parts if len(p.ids)]
        req = self._worker.request_table(Op.PULL, self.spec.key, self._code, self.spec.dim, parts,
                                         grouped.reshape(-1), what, ahead=ahead)
        self.payload_sent += ids.nbytes
        self.payload_received += out.nbytes

        def rows() -> np.ndarray:
            out[order] = grouped
            return out
        handle = self._worker.handle([req], rows)
        if not block:
            return handle
        self._worker.flush()
        return handle.wait()

    def push(self, ids: Any, grads: Any, block: bool = True) -> Handle | None:
        """Push the gradient rows of distinct ``ids``. Under ``sync`` the answer comes once
        every worker pushed this round and the rows were updated: the next ``pull`` sees them.
        ``block=False`` returns a Handle; the push leaves with the I/O thread's next flush,
        together with whatever else was started meanwhile."""
        what = f"push to table {self.spec.name!r}"
        ids = check_ids(ids, what)
        grads = check_rows(grads, len(ids), self.spec, what)
        order, parts = self._split(ids)
        grads = grads[order]
        parts = [p._replace(values=grads[p.first:p.first + len(p.ids)]) for p in parts]
        req = self._worker.request_table(Op.PUSH, self.spec.key, self._code, self.spec.dim, parts, None, what)
        handle = self._worker.handle([req], lambda: None)
        self.payload_sent += ids.nbytes + grads.nbytes
        if block:
            self._worker.flush()
            handle.wait()
            return None
        return handle

    # -- checkpoints (ps/embed/checkpoint.py) ------------------------------------------------
    def chunks(self, changed_only: bool) -> Iterator[Chunk]:
        """Every row (or those updated since the last save), server by server."""
        widths = {k: w for k, (w, _) in self.spec.optimizer.state(self.spec.dim).items()}
        count = rows_per_chunk(self.spec)
        for sid in map(server_id, range(self._num_servers)):
            after, more = None, True
            while more:
                [reply] = self._worker.command("table_export", {"name": self.spec.name, "after": after,
                                                                "count": count, "changed": changed_only},
                                               servers=[sid]).values()
                chunk = chunk_from_wire(reply, self.spec, widths)
                more = reply["more"] and len(chunk.ids) > 0
                after = int(chunk.ids[-1]) if len(chunk.ids) else after
                yield chunk

    def mark_saved(self, completed: bool = True) -> None:
        """The save ended, written whole or (``completed`` False) abandoned: every server lets
        rows be evicted again, and after a whole one counts its updates from its start."""
        self._worker.command("table_saved", {"name": self.spec.name, "completed": completed})

    def put(self, chunk: Chunk) -> None:
        """Rows from a checkpoint, each to the server that holds its id now (any server count)."""
        order, parts = self._split(chunk.ids)
        for part in parts:           # every server, rows or not: each keeps the step count
            rows = order[part.first:part.first + len(part.ids)]
            piece = Chunk(part.ids, chunk.values[rows], {k: v[rows] for k, v in chunk.state.items()}, chunk.steps)
            self._worker.command("table_put", {"name": self.spec.name, **chunk_to_wire(piece)},
                                 servers=[server_id(part.server)])


class _Done:
    """A handle already complete (a LocalTable's, a pull of no ids): ``wait()`` gives its result."""

    done = True

    def __init__(self, result: Any = None):
        self._result = result

    def wait(self, timeout: float | None = None) -> Any:
        return self._result


class LocalTable:
    """The table in this process, for a script that runs without a cluster: one worker, so
    ``sync`` and ``async`` are the same."""

    restarted = False           # a process alone is never a restart (checkpoint.save asks)

    def __init__(self, spec: TableSpec):
        self.spec = spec
        self.rows = RowTable(spec)

    def pull(self, ids: Any, block: bool = True, ahead: int = 0) -> np.ndarray | _Done:
        rows = self.rows.lookup(check_ids(ids, f"pull of table {self.spec.name!r}"))
        return rows if block else _Done(rows)

    def push(self, ids: Any, grads: Any, block: bool = True) -> _Done | None:
        what = f"push to table {self.spec.name!r}"
        ids = check_ids(ids, what)
        self.rows.apply(ids, check_rows(grads, len(ids), self.spec, what))
        return None if block else _Done()

    def chunks(self, changed_only: bool) -> Iterator[Chunk]:
        rows = self.rows.saved_rows(changed_only)
        count = rows_per_chunk(self.spec)
        for start in range(0, len(rows), count):
            yield self.rows.chunk(rows[start:start + count])

    def mark_saved(self, completed: bool = True) -> None:
        if completed:
            self.rows.saved()

    def put(self, chunk: Chunk) -> None:
        self.rows.put(chunk)
