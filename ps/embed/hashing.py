"""The 64-bit mixing behind embedding tables: which server holds an id, where an id sits in a
server's index, and the seed of its first value.

Python's ``hash()`` is salted per process, and a table's rows must be the same wherever they
are made (a worker alone, any server, a restart, a different server count), so everything
here is a fixed function of the id: splitmix64's finalizer (Steele, Lea and Flood 2014),
vectorized over numpy uint64 arrays, which wrap as the C code does. Each use XORs a salt of
its own first: with one hash for both sharding and a server's slots, every id on server r
of S would share its low bits and crowd a power-of-two index.
"""
from __future__ import annotations

import hashlib

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
SHARD_SALT = np.uint64(0x5EED5EED0000CAFE)
INDEX_SALT = np.uint64(0x0123456789ABCDEF)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's output function of uint64 ``x`` (a new array)."""
    with np.errstate(over="ignore"):
        z = x + GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def as_keys(ids: np.ndarray) -> np.ndarray:
    """int64 ids as the uint64 bits they are (no copy when already int64)."""
    return np.ascontiguousarray(ids, dtype=np.int64).view(np.uint64)


def server_of(ids: np.ndarray, num_servers: int) -> np.ndarray:
    """The server rank holding each id: a hash, not ``id % S``, so that ids that are
    multiples of S, or clustered, still spread evenly."""
    return (mix64(as_keys(ids) ^ SHARD_SALT) % np.uint64(num_servers)).astype(np.int64)


def slot_hash(keys: np.ndarray) -> np.ndarray:
    return mix64(keys ^ INDEX_SALT)


def name_seed(name: str) -> np.uint64:
    """A table's seed from its name: the same in every process and Python version."""
    return np.uint64(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little"))


def table_key(name: str) -> int:
    """The key a table's requests carry: 62 bits of its name's hash (an int msgpack packs)."""
    return int(name_seed("table:" + name)) >> 2
