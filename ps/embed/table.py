"""RowTable: one server's share of an embedding table (or a whole table, in a process that
runs alone): its ids, their rows and their optimizer state, grown by doubling.

Rows are made on first touch (ps/embed/init.py), so a lookup of an id never seen returns its
initial row and a gradient for one is applied to that row. Everything is vectorized over the
request's ids: no Python step per id.
"""
from __future__ import annotations

import numpy as np

from typing import NamedTuple

from .hashing import name_seed
from .index import IdIndex
from .init import initial_rows
from .spec import TableSpec


def sum_rows(ids: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ids, sorted, and each one's gradients summed (rows of ``grads``)."""
    if not len(ids):
        return ids, grads
    order = np.argsort(ids, kind="stable")
    ids, grads = ids[order], grads[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    return ids[starts], np.add.reduceat(grads, starts, axis=0)


CHUNK_BYTES = 8 << 20      # a checkpoint's rows travel in server commands of about this size


def rows_per_chunk(spec: TableSpec) -> int:
    """The rows of a checkpoint chunk: ids, values and optimizer state in about CHUNK_BYTES."""
    widths = spec.optimizer.state(spec.dim)
    per_row = 8 + spec.np_dtype.itemsize * (spec.dim + sum(w for w, _ in widths.values()))
    return max(1, CHUNK_BYTES // per_row)


class Chunk(NamedTuple):
    """Rows of a table as a checkpoint holds them: ids, values, each state array's rows, and
    the table's step count (Adam's bias correction goes on from it)."""

    ids: np.ndarray
    values: np.ndarray
    state: dict[str, np.ndarray]
    steps: int


class RowTable:
    def __init__(self, spec: TableSpec, capacity: int = 1024):
        self.spec = spec
        self.seed = name_seed(spec.name)
        self.index = IdIndex(capacity)
        dtype, dim = spec.np_dtype, spec.dim
        self.ids = np.empty(capacity, np.int64)
        self.values = np.empty((capacity, dim), dtype)
        self._state_spec = spec.optimizer.state(dim)
        self.widths = {name: width for name, (width, _) in self._state_spec.items()}
        self.state = {name: np.full((capacity, width), first, dtype)
                      for name, (width, first) in self._state_spec.items()}
        self.steps = 0              # updates applied: Adam's bias correction, Adagrad's lr decay
        self.rows_created = 0
        self.changed = np.zeros(capacity, bool)     # updated since the last save (incremental saves)

    def __len__(self) -> int:
        return self.index.size

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The row numbers of ``ids``, making the rows of new ones (an id twice gets one row)."""
        rows = self.index.find(ids)
        new = rows < 0
        if new.any():
            fresh, where = np.unique(ids[new], return_inverse=True)
            start = self.index.size
            self._reserve(start + len(fresh))
            rows[new] = self.index.add(fresh)[where]
            end = start + len(fresh)
            self.ids[start:end] = fresh
            self.values[start:end] = initial_rows(self.seed, fresh, self.spec.dim, self.spec.init,
                                                  self.spec.np_dtype)
            self.rows_created += len(fresh)
        return rows

    def _reserve(self, n: int) -> None:
        cap = len(self.ids)
        if n <= cap:
            return
        while cap < n:
            cap *= 2
        used = self.index.size
        self.ids = _grown(self.ids, cap, used, 0)
        self.changed = _grown(self.changed, cap, used, False)
        self.values = _grown(self.values, cap, used, 0)
        self.state = {name: _grown(arr, cap, used, self._state_spec[name][1]) for name, arr in self.state.items()}

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """The current rows of ``ids`` (a copy), made on first touch."""
        rows = self.rows(ids)          # first: making rows may grow (replace) the arrays
        return self.values[rows]

    def apply(self, ids: np.ndarray, grads: np.ndarray) -> None:
        """One optimizer step on the rows of distinct ``ids`` (``sum_rows`` makes them so)."""
        self.steps += 1
        if len(ids):
            rows = self.rows(ids)      # first: making rows may grow (replace) the arrays
            self.spec.optimizer.update(self.values, self.state, rows, grads, self.steps)
            self.changed[rows] = True

    # -- checkpoints ---------------------------------------------------------------------
    def saved_rows(self, changed_only: bool) -> np.ndarray:
        """The row numbers a save writes: every row, or those updated since the last save."""
        n = self.index.size
        return np.flatnonzero(self.changed[:n]) if changed_only else np.arange(n)

    def chunk(self, rows: np.ndarray) -> Chunk:
        return Chunk(self.ids[rows], self.values[rows], {k: v[rows] for k, v in self.state.items()}, self.steps)

    def saved(self) -> None:
        """A save completed: later incremental saves hold only rows updated after it."""
        self.changed[:] = False

    def put(self, chunk: Chunk) -> None:
        """Rows from a checkpoint: made if new, overwritten if not, with their optimizer state."""
        if set(chunk.state) != set(self.state):
            raise ValueError(f"table {self.spec.name!r}: the checkpoint holds optimizer state "
                             f"{sorted(chunk.state)}, this table's optimizer keeps {sorted(self.state)}")
        n = len(chunk.ids)
        if chunk.values.shape != (n, self.spec.dim):
            raise ValueError(f"table {self.spec.name!r}: checkpoint rows of shape {chunk.values.shape} for "
                             f"{n} ids; the table has dimension {self.spec.dim}")
        rows = self.rows(chunk.ids)
        self.values[rows] = chunk.values
        for name, arr in chunk.state.items():
            self.state[name][rows] = arr.reshape(n, -1)
        self.steps = max(self.steps, chunk.steps)


def _grown(arr: np.ndarray, cap: int, used: int, fill: float) -> np.ndarray:
    out = np.full((cap, *arr.shape[1:]), fill, arr.dtype)
    out[:used] = arr[:used]
    return out


def chunk_to_wire(chunk: Chunk) -> dict:
    """A Chunk as a server command carries it (msgpack: raw bytes, never a pickle)."""
    return {"ids": chunk.ids.tobytes(), "values": np.ascontiguousarray(chunk.values).tobytes(),
            "state": {k: np.ascontiguousarray(v).tobytes() for k, v in chunk.state.items()}, "steps": chunk.steps}


def chunk_from_wire(body: dict, spec: TableSpec, widths: dict[str, int]) -> Chunk:
    """The Chunk a command carries, checked against the table; ValueError naming what is wrong."""
    try:
        ids = np.frombuffer(body["ids"], np.int64)
        dtype, n = spec.np_dtype, len(ids)
        values = np.frombuffer(body["values"], dtype).reshape(n, spec.dim)
        state = {k: np.frombuffer(v, dtype).reshape(n, widths.get(k, 1)) for k, v in body["state"].items()}
        return Chunk(ids, values, state, int(body["steps"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"table {spec.name!r}: malformed rows in a checkpoint command: {exc}") from None
