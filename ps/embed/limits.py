"""Limits: how many rows a server keeps of a table, which go when it is full or they are old,
and after how many sightings an id gets a row at all.

Recommendation ids grow without end and most are seen once. ``admit_after=k``: an id gets a
row on its k-th lookup (counted in a count-min sketch: bounded memory, and an id may be
admitted a little early, never late); before that a lookup returns its initial row and its
gradients are dropped. ``capacity``: rows per server; when new rows would pass it, the
least recently (``lru``) or least often (``lfu``) used tenth of the rows go first.
``evict_after``: rows not touched for that many of the table's steps go.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .hashing import mix64

POLICIES = ("lru", "lfu")
_SALTS = tuple(np.uint64(0xA5A5A5A5A5A5A5A5 ^ (i * 0x9E3779B97F4A7C15 % 2**64)) for i in range(4))


@dataclass(frozen=True)
class Limits:
    capacity: int | None = None
    evict: str = "lru"
    evict_after: int | None = None
    admit_after: int = 1

    def __post_init__(self) -> None:
        for name in ("capacity", "evict_after"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be None or an int >= 1, got {value!r}")
        if not isinstance(self.admit_after, int) or isinstance(self.admit_after, bool) or self.admit_after < 1:
            raise ValueError(f"admit_after must be an int >= 1, got {self.admit_after!r}")
        if self.evict not in POLICIES:
            raise ValueError(f"evict must be one of {', '.join(POLICIES)}, got {self.evict!r}")

    def to_wire(self) -> list[Any]:
        return [self.capacity, self.evict, self.evict_after, self.admit_after]

    @classmethod
    def from_wire(cls, body: Any) -> "Limits":
        capacity, evict, evict_after, admit_after = body
        return cls(capacity, evict, evict_after, admit_after)


class CountMin:
    """Approximate counts of ids in ``depth`` x ``width`` counters: never below the true count."""

    def __init__(self, width: int = 1 << 20, depth: int = 4):
        self.mask = np.uint64(width - 1)
        self.counts = np.zeros((depth, width), np.uint32)

    def _cells(self, ids: np.ndarray) -> list[np.ndarray]:
        keys = np.ascontiguousarray(ids, np.int64).view(np.uint64)
        return [(mix64(keys ^ salt) & self.mask).astype(np.int64) for salt in _SALTS[:len(self.counts)]]

    def add(self, ids: np.ndarray) -> np.ndarray:
        """Count ``ids`` once more each; their counts after it."""
        cells = self._cells(ids)
        for row, cell in zip(self.counts, cells):
            np.add.at(row, cell, 1)
        return np.min([row[cell] for row, cell in zip(self.counts, cells)], axis=0)

    def get(self, ids: np.ndarray) -> np.ndarray:
        cells = self._cells(ids)
        return np.min([row[cell] for row, cell in zip(self.counts, cells)], axis=0)
