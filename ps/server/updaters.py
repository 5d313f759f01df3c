"""What the store needs of an optimizer (:class:`Updater`) and which one each key goes
through (:class:`Optimizers`). A Store and its backup's Mirror (ps/server/replica.py) both hold an
``Optimizers``, and both close a row-sparse round through :func:`apply_rows`, so a backup's
copy moves exactly as its primary's value did.
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Updater(Protocol):
    """What the store needs of an optimizer (``ps.optim.Updater``, or MXNet's own pickled one).

    ``elementwise`` updaters are applied chunk by chunk as each chunk's sum completes
    (``begin`` once per key per round, then ``update_chunk``); the others get the round's
    whole sum in one ``__call__``."""

    elementwise: bool
    optimizer: Any         # its hyper-parameters change between steps (server command set_params)

    def __call__(self, key: int, grad: np.ndarray, weight: np.ndarray) -> None: ...

    def begin(self, key: int, weight: np.ndarray) -> None: ...

    def update_chunk(self, key: int, offset: int, grad: np.ndarray, weight: np.ndarray) -> None: ...

    def update_rows(self, key: int, rows: np.ndarray, grad: np.ndarray, weight: np.ndarray) -> None:
        """``grad`` holds the rows ``rows`` (sorted, distinct) of a gradient shaped like
        ``weight`` (2-D: rows of the key's slice)."""

    def get_states(self) -> bytes: ...

    def set_states(self, data: bytes) -> None: ...


class Optimizers:
    """Which optimizer each key goes through. Keys are in namespace 0 unless told otherwise:
    every ``dist_*`` kvstore of an MXNet process is one ps store, and a second one that
    initializes keys (a GAN's second Trainer) gets namespace 1, 2, ... with an optimizer
    (and hyper-parameters, states) of its own. A Store and its backup's Mirror both hold one."""

    def __init__(self) -> None:
        self.updaters: dict[int, Updater] = {}
        self.multi: dict[int, bool] = {}
        self.of_key: dict[int, int] = {}      # only keys outside namespace 0

    def namespace(self, key: int) -> int:
        return self.of_key.get(key, 0)

    def updater(self, key: int) -> Updater | None:
        return self.updaters.get(self.namespace(key))

    def multi_precision(self, key: int) -> bool:
        return self.multi.get(self.namespace(key), False)

    def assign(self, keys: list[int], ns: int) -> None:
        for key in keys:
            if ns:
                self.of_key[key] = ns
            else:
                self.of_key.pop(key, None)

    def set(self, ns: int, updater: Updater | None, multi_precision: bool) -> None:
        if updater is None:
            self.updaters.pop(ns, None)
        else:
            self.updaters[ns] = updater
        self.multi[ns] = multi_precision

    def by_namespace(self) -> dict[int, list[int]]:
        """{namespace: its keys} for the keys placed outside namespace 0."""
        found: dict[int, list[int]] = {}
        for key, n in self.of_key.items():
            found.setdefault(n, []).append(key)
        return found


def whole_key(updater: Updater | None) -> bool:
    """The optimizer needs the whole gradient at once (LAMB's norms, MXNet's own updater)."""
    return updater is not None and not updater.elementwise


def apply_rows(updater: Updater | None, key: int, weight: np.ndarray, rows: np.ndarray, summed: np.ndarray) -> None:
    """Close a row-sparse round (or replay its close on a backup, ps/server/replica.py): the rows'
    sums through the optimizer, or, without one, they replace the value (MXNet assigns)."""
    if updater is None:
        weight[:] = 0
        weight[rows] = summed
    else:
        updater.update_rows(key, rows, summed, weight)
