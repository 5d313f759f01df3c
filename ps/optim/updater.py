"""Applying one optimizer to many keys on a server, and its states saved without pickle."""
from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from .base import Optimizer
from .lr_scheduler import scheduler_from_spec

STATE_FORMAT = "ps.optim.states/1"


# -- state save/load without pickle --------------------------------------------------------
def _pack(state: Any) -> Any:
    if state is None:
        return None
    if isinstance(state, np.ndarray):
        return {"dtype": state.dtype.str, "shape": list(state.shape), "data": state.tobytes()}
    return [_pack(s) for s in state]


def _unpack(obj: Any) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return np.frombuffer(obj["data"], dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
    return tuple(_unpack(s) for s in obj)


def _layout(state: Any) -> Any:
    if state is None or isinstance(state, np.ndarray):
        return None if state is None else (state.dtype.str, state.size)
    return tuple(_layout(s) for s in state)


def _slice(state: Any, off: int, n: int) -> Any:
    if state is None or isinstance(state, np.ndarray):
        return None if state is None else state[off:off + n]
    return tuple(_slice(s, off, n) for s in state)


def _take(state: Any, rows: np.ndarray, row_len: int) -> Any:
    """Flat copies of ``rows`` of every state array (states are flat, like the weight)."""
    if state is None or isinstance(state, np.ndarray):
        return None if state is None else state.reshape(-1, row_len)[rows].reshape(-1)
    return tuple(_take(s, rows, row_len) for s in state)


def _put(state: Any, rows: np.ndarray, row_len: int, taken: Any) -> None:
    if state is None:
        return
    if isinstance(state, np.ndarray):
        state.reshape(-1, row_len)[rows] = taken.reshape(-1, row_len)
        return
    for s, t in zip(state, taken):
        _put(s, rows, row_len, t)


class Updater:
    """Applies one optimizer to many keys, keeping a state per key (MXNet ``get_updater``).

    ``updater(key, grad, weight)`` is one whole update. For an :attr:`elementwise`
    optimizer the same update can also be done in pieces, which is how a server avoids a
    full-size gradient sum::

        updater.begin(key, weight)                    # counts the update, fixes lr and wd
        updater.update_chunk(key, off, grad_chunk, weight)   # any order, each slice once

    and gives bit-identical results.
    """

    def __init__(self, optimizer: Optimizer):
        self.optimizer = optimizer
        self.states: dict[int, Any] = {}
        self._loaded: set[int] = set()  # keys whose state came from set_states, checked on first use
        self._lr_wd: dict[int, tuple[float, float]] = {}   # key -> (lr, wd) of its update in pieces

    @property
    def elementwise(self) -> bool:
        """Only a class that says so itself: a subclass inheriting ``elementwise = True`` may
        have changed the arithmetic (and would then be updated chunk by chunk wrongly)."""
        return bool(type(self.optimizer).__dict__.get("elementwise", False))

    def __call__(self, key: int, grad: np.ndarray, weight: np.ndarray) -> None:
        self.optimizer.update_multi_precision(key, weight, grad, self._state(key, weight))

    def begin(self, key: int, weight: np.ndarray) -> None:
        """Start one update of ``key`` (the full ``weight``), to be done by :meth:`update_chunk`."""
        if not self.elementwise:
            raise TypeError(f"{type(self.optimizer).__name__} is not elementwise: it cannot update in chunks")
        self._state(key, weight)
        self._lr_wd[key] = self.optimizer.begin_update(key)

    def update_chunk(self, key: int, off: int, grad: np.ndarray, weight: np.ndarray) -> None:
        """Update ``weight[off:off + grad.size]`` (and the same slice of the states) in place."""
        n = grad.size
        self.optimizer.step_multi_precision(key, weight[off:off + n], grad, _slice(self.states[key], off, n),
                                            *self._lr_wd[key])

    def update_rows(self, key: int, rows: np.ndarray, grad: np.ndarray, weight: np.ndarray) -> None:
        """One update from a row-sparse gradient: ``grad`` holds rows ``rows`` (sorted,
        distinct) of a gradient shaped like the 2-D ``weight``. A lazy optimizer updates
        those rows of the weight and states only (gathered, stepped, put back: the same
        arithmetic as a dense step on them); another gets the gradient dense, with zeros."""
        flat = weight.reshape(-1)
        if not (self.optimizer.lazy_rows and self.elementwise):
            dense = np.zeros(weight.shape, grad.dtype)
            dense[rows] = grad
            self(key, dense.reshape(-1), flat)
            return
        state = self._state(key, flat)
        row_len = weight.shape[1]
        lr, wd = self.optimizer.begin_update(key)
        w = weight[rows]
        taken = _take(state, rows, row_len)
        self.optimizer.step_multi_precision(key, w.reshape(-1), grad.reshape(-1), taken, lr, wd)
        weight[rows] = w
        _put(state, rows, row_len, taken)

    def _state(self, key: int, weight: np.ndarray) -> Any:
        if key not in self.states:
            self.states[key] = self.optimizer.create_state_multi_precision(key, weight)
        elif key in self._loaded:
            self._check_loaded(key, weight)
        return self.states[key]

    def _check_loaded(self, key: int, weight: np.ndarray) -> None:
        fresh = self.optimizer.create_state_multi_precision(key, weight)
        if _layout(fresh) != _layout(self.states[key]):
            raise ValueError(f"loaded optimizer state for key {key} does not fit its {weight.size}-element "
                             f"{weight.dtype} weight: states must come from the same job layout and "
                             f"optimizer settings")
        self._loaded.discard(key)

    def get_states(self) -> bytes:
        """Serialize per-key states, update counts, num_update and the lr schedule (msgpack, no pickle).

        Example::

            blob = updater.get_states(); other.set_states(blob)
        """
        opt = self.optimizer
        return msgpack.packb({
            "format": STATE_FORMAT,
            "optimizer": opt.to_spec(),
            "update_counts": [[k, v] for k, v in opt.index_update_count.items()],
            "states": [[k, _pack(s)] for k, s in self.states.items()],
        }, use_bin_type=True)

    def set_states(self, data: bytes) -> None:
        """Restore what :meth:`get_states` saved, so training continues exactly.

        The blob must come from the same job layout (same keys, servers and key slicing):
        states are per server slice and are checked against the weight size on first use.
        Hyper-parameters stay those of the current optimizer; the learning rate, its
        scheduler state, ``num_update`` and the per-key update counts are restored.

        Raises
        ------
        ValueError
            The blob is not an optimizer state, or was saved by another optimizer type.

        Example::

            updater.set_states(open("opt.states", "rb").read())
        """
        try:
            saved = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            raise ValueError(f"not an optimizer state blob: {e}") from None
        if not isinstance(saved, dict) or saved.get("format") != STATE_FORMAT:
            raise ValueError("not an optimizer state blob saved by ps.optim.Updater.get_states")
        name, params = saved["optimizer"]["name"], saved["optimizer"]["params"]
        opt = self.optimizer
        if name != type(opt).__name__.lower():
            raise ValueError(f"optimizer states were saved by {name!r}, cannot load into "
                             f"{type(opt).__name__.lower()!r}")
        opt.num_update = int(params["num_update"])
        opt.index_update_count = {int(k): int(v) for k, v in saved["update_counts"]}
        opt.lr_scheduler = scheduler_from_spec(params["lr_scheduler"])
        if params["learning_rate"] is not None:
            opt.lr = float(params["learning_rate"])
        self.states = {int(k): _unpack(s) for k, s in saved["states"]}
        self._loaded = set(self.states)
