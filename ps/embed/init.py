"""A row's first value, made from (table, id) alone.

Rows are created when an id is first touched, on whichever server holds it. A counter-based
generator (a hash of seed, id and column) gives the same row there, on a restarted server,
after a reshard, and in a process that runs alone, with no state to carry: the property a
seeded ``torch.Generator`` cannot give when rows are created in a different order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hashing import GOLDEN, as_keys, mix64

KINDS = ("normal", "uniform", "zeros")
_LOW24 = np.uint64((1 << 24) - 1)
_UNIT24 = np.float32(2.0 ** -24)


@dataclass(frozen=True)
class Init:
    """``normal``: N(0, scale^2), torch.nn.Embedding's default with scale 1; ``uniform``:
    U(-scale, scale), as DLRM's tables; ``zeros``."""

    kind: str = "normal"
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"init kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not (isinstance(self.scale, (int, float)) and self.scale >= 0):
            raise ValueError(f"init scale must be a number >= 0, got {self.scale!r}")


def _bits(base: np.ndarray, dim: int) -> np.ndarray:
    """(n, dim) 64-bit hashes, one per element."""
    with np.errstate(over="ignore"):
        return mix64(base[:, None] + (np.arange(1, dim + 1, dtype=np.uint64)) * GOLDEN)


def _unit(bits: np.ndarray) -> np.ndarray:
    """24 of ``bits`` (the low ones) as float32 in (0, 1]."""
    return ((bits & _LOW24).astype(np.float32) + np.float32(1)) * _UNIT24


def initial_rows(seed: np.uint64, ids: np.ndarray, dim: int, init: Init, dtype: np.dtype) -> np.ndarray:
    """The first values of rows ``ids`` of a table seeded ``seed``: shape (len(ids), dim).
    float32 arithmetic throughout: a row's first value needs no more, and making rows is
    what a server's first steps spend their time on."""
    n = len(ids)
    if init.kind == "zeros" or n == 0 or dim == 0:
        return np.zeros((n, dim), dtype)
    bits = _bits(mix64(as_keys(ids) ^ seed), dim)
    scale = np.float32(init.scale)
    if init.kind == "uniform":
        return ((np.float32(2) * _unit(bits) - np.float32(1)) * scale).astype(dtype, copy=False)
    # Box-Muller on two independent 24-bit uniforms from each element's hash
    radius = np.sqrt(np.float32(-2) * np.log(_unit(bits)))
    angle = _unit(bits >> np.uint64(32)) * np.float32(2 * np.pi)
    return (radius * np.cos(angle) * scale).astype(dtype, copy=False)
