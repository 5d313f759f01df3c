"""Whether what a worker's call passes fits the key it names, checked before anything travels.

A key's shape, dtype and placement are recorded once, at init or declare (:class:`KeyInfo`
in a :class:`KeyTable`); every later push, pull or row-sparse call is checked against
that record here, so that a wrong shape, dtype, key or row id fails at the caller's line
with a message naming the bad value, never on a server. Pure: no sockets, no threads,
no cluster, so each rule is tested on its own (tests/unit/test_keyinfo.py).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from . import keys as keys_mod
from .frames import dtype_code
from .keys import Slice


@dataclass(frozen=True)
class KeyInfo:
    """What every worker records at init: enough to check and route later calls."""

    name: Any
    key: int
    shape: tuple[int, ...]
    dtype: np.dtype
    dtype_code: int
    slices: tuple[Slice, ...]
    row_len: int = 1          # elements per row (slices hold whole rows)
    label: str = ""           # how messages name it: the caller's key (see init's labels)
    declared: bool = False    # made by its first push (declare), not by init
    joinable: bool = False    # its rounds may close without workers that joined (declare, join)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class RowSparse(NamedTuple):
    """Some rows of a key's value (MXNet's row_sparse): ``values[i]`` is row ``rows[i]``,
    ``values.shape == (len(rows),) + shape[1:]``. A push of one sends only these rows; the
    servers update only them where the optimizer is lazy (MXNet's ``lazy_update``)."""

    rows: np.ndarray
    values: np.ndarray


class KeyTable:
    """The keys one store initialized or declared. Its rules span keys: a store never
    mixes int and str keys (their int forms could collide) nor initializes a key twice."""

    def __init__(self, num_servers: int, bigarray_bound: int):
        self.num_servers = num_servers
        self.bigarray_bound = bigarray_bound
        self.kind: type | None = None          # int or str, once a key is made
        self._infos: dict[Any, KeyInfo] = {}

    def get(self, key: Any) -> KeyInfo | None:
        return self._infos.get(key)

    def info(self, key: Any) -> KeyInfo:
        """The record of ``key``; TypeError for a key of a wrong type, KeyError if not made."""
        info = self._infos.get(key)
        if info is None:
            keys_mod.to_int_key(key)    # a key of a wrong type is named as that, not as missing
            raise KeyError(f"key {key!r} is not initialized; call kv.init({key!r}, value) first")
        return info

    def new(self, key: Any, value: np.ndarray, label: str | None = None, server: int | None = None) -> KeyInfo:
        """The record ``key`` gets for ``value``'s shape and dtype (not added: see :meth:`add`).
        Fixes the table's key kind, so a later key of the other kind is refused. ``server``: where
        a key that is not cut lives, in place of its hash's server (keys.balance); every worker
        must pass the same."""
        label = label or repr(key)
        kind = str if isinstance(key, str) else int
        if self.kind is not None and kind is not self.kind:
            raise TypeError(f"key {label}: one store cannot mix int and str keys")
        if key in self._infos:
            raise ValueError(f"key {label} is already initialized; a key can be initialized only once")
        int_key = keys_mod.to_int_key(key)
        self.kind = kind
        row_len = max(1, int(np.prod(value.shape[1:], dtype=np.int64))) if value.ndim >= 2 else 1
        slices = keys_mod.plan(int_key, value.size, self.num_servers, self.bigarray_bound, row_len)
        if server is not None:
            if isinstance(server, bool) or not isinstance(server, (int, np.integer)) or \
                    not 0 <= server < self.num_servers:
                raise ValueError(f"key {label}: server {server!r} is not one of the {self.num_servers} servers")
            if len(slices) == 1:
                slices = (Slice(int(server), 0, value.size),)
        return KeyInfo(key, int_key, tuple(value.shape), value.dtype, dtype_code(value.dtype), slices, row_len, label)

    def add(self, info: KeyInfo) -> None:
        self._infos[info.name] = info

    def infos(self) -> list[KeyInfo]:
        return list(self._infos.values())


def dense(info: KeyInfo, value: Any, what: str) -> np.ndarray:
    """One contiguous array for ``info``; a list (one per device) is summed first."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{what} key {info.label}: empty list of values")
        arrays = [dense(info, v, what) for v in value]
        return arrays[0] if len(arrays) == 1 else functools.reduce(np.add, arrays)
    arr = np.asarray(value)
    if arr.shape != info.shape:
        raise ValueError(f"{what} key {info.label}: shape {arr.shape} does not match the "
                         f"initialized shape {info.shape}")
    if arr.dtype != info.dtype:
        raise TypeError(f"{what} key {info.label}: dtype {arr.dtype} does not match the "
                        f"initialized dtype {info.dtype}")
    return np.ascontiguousarray(arr)


def receiver(info: KeyInfo, out: Any) -> tuple[np.ndarray, Any]:
    """An array replies can be written into, and what to return once they are."""
    if out is None:
        arr = np.empty(info.shape, info.dtype)
        return arr, lambda: arr
    targets = list(out) if isinstance(out, (list, tuple)) else [out]
    for t in targets:
        if not isinstance(t, np.ndarray) or t.shape != info.shape:
            raise ValueError(f"out for key {info.label} must be a numpy array of shape {info.shape}, "
                             f"got {getattr(t, 'shape', type(t).__name__)}")
    first = targets[0]
    direct = first.dtype == info.dtype and first.flags.c_contiguous and first.flags.writeable
    recv = first if direct else np.empty(info.shape, info.dtype)

    def final() -> Any:
        for t in targets:
            if t is not recv:
                np.copyto(t, recv, casting="unsafe")
        return out
    return recv, final


def is_rows(value: Any) -> bool:
    """A row-sparse push: a RowSparse, or a non-empty list of them (one per device)."""
    if isinstance(value, RowSparse):
        return True
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, RowSparse) for v in value)


def row_sparse(info: KeyInfo, value: Any) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a RowSparse push (a list is summed), sorted, each once, values 2-D."""
    parts = list(value) if isinstance(value, (list, tuple)) and not isinstance(value, RowSparse) else [value]
    all_rows, all_values = [], []
    for part in parts:
        rows = np.asarray(part.rows).reshape(-1)
        values = np.asarray(part.values)
        if values.shape != (rows.size,) + info.shape[1:]:
            raise ValueError(f"push to key {info.label}: {rows.size} rows need values of shape "
                             f"{(rows.size,) + info.shape[1:]}, got {values.shape}")
        if values.dtype != info.dtype:
            raise TypeError(f"push to key {info.label}: dtype {values.dtype} does not match the "
                            f"initialized dtype {info.dtype}")
        all_rows.append(check_rows(info, rows))
        all_values.append(values.reshape(rows.size, info.row_len))
    rows, values = np.concatenate(all_rows), np.concatenate(all_values)
    unique, inverse = np.unique(rows, return_inverse=True)
    if unique.size == rows.size:
        order = np.argsort(rows, kind="stable")
        return rows[order], np.ascontiguousarray(values[order])
    summed = np.zeros((unique.size, info.row_len), info.dtype)
    np.add.at(summed, inverse.reshape(-1), values)
    return unique, summed


def unique_rows(info: KeyInfo, ids: Any) -> np.ndarray:
    """Sorted distinct int64 row ids, checked against the key's rows."""
    return np.unique(check_rows(info, np.asarray(ids).reshape(-1)))


def check_rows(info: KeyInfo, rows: np.ndarray) -> np.ndarray:
    """int64 row ids (MXNet passes them as floats), each a row of the key."""
    if not info.shape:
        raise ValueError(f"key {info.label} is a scalar: it has no rows")
    if rows.size and not np.issubdtype(rows.dtype, np.integer):
        as_int = rows.astype(np.int64)
        if not np.array_equal(as_int, rows):
            raise ValueError(f"row ids of key {info.label} must be whole numbers, got {rows[as_int != rows][:3]}")
        rows = as_int
    rows = rows.astype(np.int64, copy=False)
    if rows.size and (rows.min() < 0 or rows.max() >= info.shape[0]):
        bad = rows.min() if rows.min() < 0 else rows.max()
        raise ValueError(f"row id {bad} is out of range for key {info.label} of shape {info.shape}")
    return rows


def pairs(key: Any, value: Any) -> list[tuple[Any, Any]]:
    """(key, value) pairs of a call on one key or on a list of keys."""
    if isinstance(key, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(key):
            raise ValueError(f"{len(key)} keys need a list of {len(key)} values")
        return list(zip(key, value))
    return [(key, value)]


def triples(key: Any, value: Any, out: Any) -> list[tuple[Any, Any, Any]]:
    """(key, value, out) of a pull or pushpull on one key or on a list of keys; ``value`` None
    for a pull, ``out`` None for a new array."""
    many = isinstance(key, (list, tuple))
    keys = key if many else [key]
    values = [None] * len(keys) if value is None else value if many else [value]
    outs = out if many and out is not None else [out] * len(keys)
    if len(values) != len(keys) or len(outs) != len(keys):
        raise ValueError(f"{len(keys)} keys but {len(values)} values / {len(outs)} outputs")
    return list(zip(keys, values, outs))


def key_labels(labels: Any, n: int) -> list[str | None]:
    """init's ``labels`` (None, one str, or one per key) as one per key of ``n``."""
    labels = [None] * n if labels is None else [labels] if isinstance(labels, str) else list(labels)
    if len(labels) != n:
        raise ValueError(f"{n} keys but {len(labels)} labels")
    return labels


def member_ranks(members: Sequence[int], rank: int, num_workers: int) -> list[int]:
    """``members`` checked: ranks of this job, ``rank`` among them; sorted, once each."""
    ranks = sorted({int(r) for r in members})
    bad = [r for r in ranks if not 0 <= r < num_workers]
    if not ranks or bad:
        raise ValueError(f"members {list(members)!r}: not a non-empty list of ranks of this job's "
                         f"{num_workers} workers")
    if rank not in ranks:
        raise ValueError(f"rank {rank} is not one of the members {ranks} it initializes keys for")
    return ranks


def int_keyed(spec: dict[str, Any]) -> dict[str, Any]:
    """Per-key multipliers travel under the servers' int keys (str keys are hashed)."""
    params = dict(spec.get("params", {}))
    for name in ("lr_mult", "wd_mult"):
        if params.get(name):
            params[name] = {keys_mod.to_int_key(k): v for k, v in params[name].items()}
    return {**spec, "params": params}
