"""IdIndex: int64 id -> row number, an open-addressing hash table in numpy arrays.

A server looks up and inserts thousands of ids per request; a dict would cost a Python
step per id. Here every probe round is one vectorized pass over the ids still unresolved
(linear probing, load at most 1/2, so a few rounds resolve all), and inserting a batch
settles collisions between its own ids by letting the first claimant of a slot have it and
probing on with the rest.
"""
from __future__ import annotations

import numpy as np

from .hashing import as_keys, slot_hash

EMPTY = -1


class IdIndex:
    def __init__(self, capacity: int = 1024):
        cap = 1 << max(4, int(capacity - 1).bit_length())
        self._keys = np.zeros(cap, np.uint64)
        self._rows = np.full(cap, EMPTY, np.int64)
        self.size = 0

    @property
    def capacity(self) -> int:
        return len(self._rows)

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        """Per key, the slot holding it or else the first empty slot of its probe sequence."""
        mask = np.uint64(len(self._rows) - 1)
        pos = (slot_hash(keys) & mask).astype(np.int64)
        slots = np.empty(len(keys), np.int64)
        todo = np.arange(len(keys))
        while todo.size:
            p = pos[todo]
            settled = (self._rows[p] == EMPTY) | (self._keys[p] == keys[todo])
            slots[todo[settled]] = p[settled]
            todo = todo[~settled]
            pos[todo] = (p[~settled] + 1) & int(mask)
        return slots

    def find(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row, or -1 where the id is not in the index."""
        keys = as_keys(ids)
        if not len(keys):
            return np.empty(0, np.int64)
        return self._rows[self._slots(keys)]

    def add(self, ids: np.ndarray) -> np.ndarray:
        """Index distinct ids that are not in it yet as rows size, size + 1, ...; their rows."""
        keys = as_keys(ids)
        n = len(keys)
        rows = np.arange(self.size, self.size + n, dtype=np.int64)
        if 2 * (self.size + n) > len(self._rows):
            self._grow(2 * (self.size + n))
        self._place(keys, rows)
        self.size += n
        return rows

    def reserve(self, n: int) -> None:
        """Room for ``n`` ids without growing again (a table about to be filled: a restore)."""
        if 2 * n > len(self._rows):
            self._grow(2 * n)

    def _place(self, keys: np.ndarray, rows: np.ndarray) -> None:
        while len(keys):
            slots = self._slots(keys)
            first = np.unique(slots, return_index=True)[1]     # one key per empty slot this round
            self._keys[slots[first]] = keys[first]
            self._rows[slots[first]] = rows[first]
            rest = np.ones(len(keys), bool)
            rest[first] = False
            keys, rows = keys[rest], rows[rest]

    def _grow(self, at_least: int) -> None:
        used = self._rows != EMPTY
        keys, rows = self._keys[used], self._rows[used]
        cap = 1 << int(at_least - 1).bit_length()
        self._keys = np.zeros(cap, np.uint64)
        self._rows = np.full(cap, EMPTY, np.int64)
        self._place(keys, rows)
