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
from .limits import CountMin
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
        # incremental saves: a row's update count (``changes`` when it was last updated) against
        # the count when the last completed save began; counts, not flags, so an update made
        # while a save is under way (async, ssp) stays for the next one
        self.updated = np.zeros(capacity, np.uint64)
        self.changes = 0            # updates to rows so far
        self.saved_at = 0           # ``changes`` when the last completed save began
        limits = spec.limits
        self.touched = np.zeros(capacity, np.int64)  # the step a row was last looked up or updated (lru)
        self.hits = np.zeros(capacity, np.int64)     # lookups and updates of a row (lfu)
        self.sketch = CountMin(1 << 18) if limits.admit_after > 1 else None
        self.hold_evictions = False                  # a save is under way: row numbers must stay
        self.evicted = self.not_admitted = self.dropped = 0
        self.gone: list[np.ndarray] | None = None    # a server's: ids evicted since it last journaled them

    def __len__(self) -> int:
        return self.index.size

    def rows(self, ids: np.ndarray, admit: np.ndarray | None = None, fill: bool = True,
             evict: bool = True) -> np.ndarray:
        """The row numbers of ``ids``, making the rows of new ones (an id twice gets one row);
        ``admit``: per id, whether a new one may have a row (-1 where it gets none); ``fill``
        False: the caller writes the new rows' values (no initial values computed); ``evict``
        False: never evict to make room (rows a primary held, replayed)."""
        rows = self.index.find(ids)
        new = rows < 0 if admit is None else (rows < 0) & admit
        if not new.any():
            return rows
        fresh, where = np.unique(ids[new], return_inverse=True)
        capacity = self.spec.limits.capacity
        if capacity is not None and self.index.size + len(fresh) > capacity and evict and not self.hold_evictions:
            self._evict_for(len(fresh), keep=rows[rows >= 0])
            rows = self.index.find(ids)          # the row numbers moved
        start = self.index.size
        self._reserve(start + len(fresh))
        rows[new] = self.index.add(fresh)[where]
        end = start + len(fresh)
        self.ids[start:end] = fresh
        if fill:
            self.values[start:end] = initial_rows(self.seed, fresh, self.spec.dim, self.spec.init,
                                                  self.spec.np_dtype)
        self.touched[start:end], self.hits[start:end] = self.steps, 0
        self.rows_created += len(fresh)
        return rows

    def reserve(self, n: int) -> None:
        """Room for ``n`` rows at once (a restore about to put them: no growing by doubling)."""
        self._reserve(n)
        self.index.reserve(n)

    def _reserve(self, n: int) -> None:
        cap = len(self.ids)
        if n <= cap:
            return
        while cap < n:
            cap *= 2
        used = self.index.size
        # ids, values, touched and hits are written when a row is made: no fill
        self.ids = _grown(self.ids, cap, used, None)
        self.updated = _grown(self.updated, cap, used, 0)
        self.touched = _grown(self.touched, cap, used, None)
        self.hits = _grown(self.hits, cap, used, None)
        self.values = _grown(self.values, cap, used, None)
        self.state = {name: _grown(arr, cap, used, self._state_spec[name][1]) for name, arr in self.state.items()}

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """The current rows of ``ids`` (a copy), made on first touch, or on the ``admit_after``-th
        (an id not admitted yet gets its initial row, which is not kept)."""
        admit = None
        if self.sketch is not None:
            admit = np.ones(len(ids), bool)
            unknown = self.index.find(ids) < 0
            if unknown.any():
                admit[unknown] = self.sketch.add(ids[unknown]) >= self.spec.limits.admit_after
        rows = self.rows(ids, admit)          # first: making rows may grow (replace) the arrays
        have = rows >= 0
        if have.all():
            self._touch(rows)
            return self.values[rows]
        self.not_admitted += int((~have).sum())
        out = initial_rows(self.seed, ids, self.spec.dim, self.spec.init, self.spec.np_dtype)
        out[have] = self.values[rows[have]]
        self._touch(rows[have])
        return out

    def apply(self, ids: np.ndarray, grads: np.ndarray) -> None:
        """One optimizer step on the rows of distinct ``ids`` (``sum_rows`` makes them so); the
        gradients of ids not admitted yet are dropped."""
        self.steps += 1
        if len(ids):
            admit = None
            if self.sketch is not None:
                admit = self.sketch.get(ids) >= self.spec.limits.admit_after
            rows = self.rows(ids, admit)      # first: making rows may grow (replace) the arrays
            keep = rows >= 0
            if not keep.all():
                self.dropped += int((~keep).sum())
                rows, grads = rows[keep], grads[keep]
            self.spec.optimizer.update(self.values, self.state, rows, grads, self.steps)
            self.changes += 1
            self.updated[rows] = self.changes
            self._touch(rows)
        after = self.spec.limits.evict_after
        if after is not None and self.steps % max(1, after // 4) == 0 and not self.hold_evictions:
            n = self.index.size
            self._drop(self.steps - self.touched[:n] > after)

    def _touch(self, rows: np.ndarray) -> None:
        self.touched[rows] = self.steps
        self.hits[rows] += 1

    # -- limits (ps/embed/limits.py) --------------------------------------------------------
    def _evict_for(self, fresh: int, keep: np.ndarray) -> None:
        """Make room for ``fresh`` new rows: the least recently (or often) used rows go, a tenth
        of the capacity at least, never the rows of ``keep`` (the request's own)."""
        n, capacity = self.index.size, self.spec.limits.capacity
        count = min(n, max(n + fresh - capacity, capacity // 10))
        score = (self.touched if self.spec.limits.evict == "lru" else self.hits)[:n].astype(np.float64)
        score[keep] = np.inf
        victims = np.argpartition(score, count - 1)[:count] if count else np.empty(0, np.int64)
        victims = victims[np.isfinite(score[victims])]
        mask = np.zeros(n, bool)
        mask[victims] = True
        self._drop(mask)

    def _drop(self, mask: np.ndarray) -> None:
        """Remove the rows where ``mask`` (over the rows in use) is set; the rest are renumbered
        in order and the index is built again."""
        count = int(mask.sum())
        if not count:
            return
        n, kept = self.index.size, ~mask
        m = n - count
        if self.gone is not None:
            self.gone.append(self.ids[:n][mask])     # a copy (boolean indexing), taken before the move
        for name in ("ids", "values", "updated", "touched", "hits"):
            arr = getattr(self, name)
            arr[:m] = arr[:n][kept]
        self.updated[m:n] = 0
        for name, arr in self.state.items():
            arr[:m] = arr[:n][kept]
            arr[m:n] = self._state_spec[name][1]      # a row made there later starts fresh
        self.index = IdIndex(len(self.ids))
        self.index.add(self.ids[:m])
        self.evicted += count

    def remove(self, ids: np.ndarray) -> None:
        """Drop the rows of ``ids`` (a backup's copy following its primary's evictions)."""
        rows = self.index.find(ids)
        rows = rows[rows >= 0]
        if len(rows):
            mask = np.zeros(self.index.size, bool)
            mask[rows] = True
            self._drop(mask)

    # -- checkpoints ---------------------------------------------------------------------
    def saved_rows(self, changed_only: bool) -> np.ndarray:
        """The row numbers a save writes: every row, or those updated since the last save."""
        n = self.index.size
        return np.flatnonzero(self.updated[:n] > self.saved_at) if changed_only else np.arange(n)

    def chunk(self, rows: np.ndarray) -> Chunk:
        return Chunk(self.ids[rows], self.values[rows], {k: v[rows] for k, v in self.state.items()}, self.steps)

    def chunk_of(self, ids: np.ndarray) -> Chunk:
        """The rows ``ids`` have now (ids without one, not admitted, left out)."""
        rows = self.index.find(ids)
        return self.chunk(rows[rows >= 0])

    def saved(self, began: int | None = None) -> None:
        """A save completed that began when ``changes`` was ``began`` (now, if None): later
        incremental saves hold the rows updated after that."""
        self.saved_at = max(self.saved_at, self.changes if began is None else int(began))

    def put(self, chunk: Chunk, updated: int | np.ndarray | None = None, evict: bool = True) -> None:
        """Rows from a checkpoint (or a backup's copy: ``updated``, the primary's update count
        of the rows): made if new, overwritten if not, with their optimizer state. ``evict``
        False: rows a primary held (its copy, or a restart restored from it), which may be more
        than its capacity while a save held its evictions; its own evictions are replayed."""
        if set(chunk.state) != set(self.state):
            raise ValueError(f"table {self.spec.name!r}: the checkpoint holds optimizer state "
                             f"{sorted(chunk.state)}, this table's optimizer keeps {sorted(self.state)}")
        n = len(chunk.ids)
        if chunk.values.shape != (n, self.spec.dim):
            raise ValueError(f"table {self.spec.name!r}: checkpoint rows of shape {chunk.values.shape} for "
                             f"{n} ids; the table has dimension {self.spec.dim}")
        rows = self.rows(chunk.ids, fill=False, evict=evict)
        self.values[rows] = chunk.values
        for name, arr in chunk.state.items():
            self.state[name][rows] = arr.reshape(n, self.widths[name])
        if updated is not None:
            self.updated[rows] = updated
            self.changes = max(self.changes, int(np.max(updated, initial=0)))
        self.steps = max(self.steps, chunk.steps)


def _grown(arr: np.ndarray, cap: int, used: int, fill: float | None) -> np.ndarray:
    shape = (cap, *arr.shape[1:])
    out = np.empty(shape, arr.dtype) if fill is None else np.full(shape, fill, arr.dtype)
    out[:used] = arr[:used]
    return out


def chunk_to_wire(chunk: Chunk) -> dict:
    """A Chunk as a server command carries it (msgpack: raw bytes, never a pickle)."""
    return {"ids": chunk.ids.tobytes(), "values": np.ascontiguousarray(chunk.values).tobytes(),
            "state": {k: np.ascontiguousarray(v).tobytes() for k, v in chunk.state.items()}, "steps": chunk.steps}


def chunk_from_wire(body: dict, spec: TableSpec, widths: dict[str, int]) -> Chunk:
    """The Chunk a command carries, checked against the table; ValueError naming what is wrong."""
    names = sorted(body.get("state", {})) if isinstance(body, dict) and isinstance(body.get("state"), dict) else None
    if names is not None and names != sorted(widths):
        raise ValueError(f"table {spec.name!r}: the checkpoint holds optimizer state {names}, this table's "
                         f"optimizer keeps {sorted(widths)}")
    try:
        ids = np.frombuffer(body["ids"], np.int64)
        dtype, n = spec.np_dtype, len(ids)
        values = np.frombuffer(body["values"], dtype).reshape(n, spec.dim)
        state = {k: np.frombuffer(v, dtype).reshape(n, widths[k]) for k, v in body["state"].items()}
        return Chunk(ids, values, state, int(body["steps"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"table {spec.name!r}: malformed rows in a checkpoint command: {exc}") from None
