"""Where a key's values live: MXNet's placement rule, and chunking for transport. Pure.

An array with fewer than ``MXNET_KVSTORE_BIGARRAY_BOUND`` elements lives whole on server
``(key * 9973) % num_servers``; a larger one is cut into ``num_servers`` contiguous slices
with round-half-away boundaries, slice i on server i (MXNet ``EncodeDefaultKey``). The cut
falls between rows (MXNet cuts its row_sparse keys so): every slice holds whole rows, so a
row-sparse push or pull of any key finds each row on one server. A key with fewer rows
than servers leaves the last servers out.
MXNet computes the hash in 32-bit ``int`` and overflows for keys >= 215330; ps uses
exact integers there, so those keys may land on another server than MXNet's.

Where every worker knows the whole set of keys alike (ps.torch's gradients), :func:`balance`
places the uncut ones by size instead of by hash: the hash leaves one server with a third
more bytes than the mean on ResNet-50's shapes, and the busiest server sets the step.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import lru_cache

MAX_KEY = (1 << 62) - 1
CHUNK_BYTES = 1 << 20   # large slices travel in messages of about this size


@dataclass(frozen=True)
class Slice:
    """Elements ``[start, start + size)`` of a key's flattened array, held by server ``server``."""

    server: int
    start: int
    size: int


def str_key(name: str) -> int:
    """Strings map to ints by hash, so every worker agrees whatever its init order."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def to_int_key(key: int | str) -> int:
    if isinstance(key, str):
        return str_key(key)
    if isinstance(key, bool) or not isinstance(key, int):
        try:
            import numpy as np
            if isinstance(key, np.integer):
                return to_int_key(int(key))
        except ImportError:  # pragma: no cover
            pass
        raise TypeError(f"keys must be int or str, got {type(key).__name__} {key!r}")
    if not 0 <= key <= MAX_KEY:
        raise ValueError(f"int keys must be in [0, 2**62), got {key}")
    return key


def _round_half_away(x: float) -> int:
    r = math.floor(x)
    return r + 1 if x - r >= 0.5 else r


@lru_cache(maxsize=65536)
def plan(key: int, size: int, num_servers: int, bound: int, row_len: int = 1) -> tuple[Slice, ...]:
    """The slices of a ``size``-element array of ``row_len``-element rows under ``key``;
    empty slices are left out."""
    if size < bound or num_servers == 1:
        return (Slice((key * 9973) % num_servers, 0, size),)
    rows = size // row_len
    edges = [_round_half_away(rows / num_servers * i) * row_len for i in range(num_servers + 1)]
    return tuple(Slice(i, edges[i], edges[i + 1] - edges[i])
                 for i in range(num_servers) if edges[i + 1] > edges[i])


def chunks(size: int, itemsize: int, chunk_bytes: int = CHUNK_BYTES) -> list[tuple[int, int]]:
    """``(offset, length)`` pieces of at most ``chunk_bytes`` covering ``size`` elements."""
    step = max(1, chunk_bytes // max(1, itemsize))
    if size <= step:
        return [(0, size)]
    return [(off, min(step, size - off)) for off in range(0, size, step)]


def balance(arrays: Sequence[tuple[Hashable, int]], num_servers: int, bound: int,
            held: list[int] | None = None) -> dict[Hashable, int]:
    """A server for each ``(name, size)`` array that lives whole on one (fewer than ``bound``
    elements), so that the servers hold about as many elements each: largest first, each to
    the server holding least so far (ties: the lowest), a cut array counting on every server.
    Depends on the set, not its order (ties in size go by name), so workers that list the same
    arrays in another order agree. Names must be unique and comparable.

    ``held``: the elements each server holds already (an earlier set's placement, so that a
    second set does not start on the servers the first one filled); the call adds this set's
    to it, in place."""
    load = held if held is not None else [0] * num_servers
    if len(load) != num_servers:
        raise ValueError(f"held has {len(load)} servers' counts for {num_servers} servers")
    placed: dict[Hashable, int] = {}
    if num_servers <= 1:
        return placed
    for name, size in sorted(arrays, key=lambda a: (-a[1], a[0])):
        if size >= bound:
            for piece in plan(0, size, num_servers, bound):
                load[piece.server] += piece.size
            continue
        server = min(range(num_servers), key=load.__getitem__)
        placed[name] = server
        load[server] += size
    return placed
