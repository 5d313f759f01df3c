"""MXNet NDArrays as numpy arrays over the same memory, so ps sends gradients from, and
writes weights into, the NDArrays themselves (no ``asnumpy`` copies)."""
from __future__ import annotations

import ctypes
import numbers
from typing import Any

import numpy as np


def to_numpy(value: Any, write: bool = False) -> Any:
    """NDArray (or nested lists of them) -> numpy, as a zero-copy view when it can be."""
    if isinstance(value, (list, tuple)):
        return [to_numpy(v, write) for v in value]
    if not hasattr(value, "asnumpy"):
        return np.asarray(value)
    view = numpy_view(value, write)
    return view if view is not None else value.asnumpy()


def is_sparse(value: Any) -> bool:
    return any(getattr(a, "stype", "default") != "default" for a in flatten(value))


def numpy_view(nd: Any, write: bool, wait: bool = True) -> np.ndarray | None:
    """A numpy array over a dense CPU NDArray's own memory (no copy); None where that is not
    possible. With ``wait`` it is usable at once: MXNet's engine has finished every pending
    operation on ``nd``. Without, only an engine operation that depends on ``nd`` may use it.

    The caller keeps ``nd`` alive while the view is in use and issues no MXNet op on it
    meanwhile: inside a Trainer step nothing else touches parameters or gradients.
    """
    if not dense_cpu(nd):
        return None
    from mxnet.base import _LIB, check_call
    if wait:
        check_call((_LIB.MXNDArrayWaitToWrite if write else _LIB.MXNDArrayWaitToRead)(nd.handle))
    ptr = ctypes.c_void_p()
    # For an array in an MKL-DNN layout this first converts it to the default one (and waits).
    check_call(_LIB.MXNDArrayGetData(nd.handle, ctypes.byref(ptr)))
    dtype = np.dtype(nd.dtype)
    if not ptr.value or not nd.size:
        return None
    buf = (ctypes.c_char * (nd.size * dtype.itemsize)).from_address(ptr.value)
    view = np.frombuffer(buf, dtype=dtype).reshape(nd.shape)
    if not write:
        view.flags.writeable = False
    return view


def dense_cpu(nd: Any) -> bool:
    return (hasattr(nd, "handle") and getattr(nd, "stype", "default") == "default"
            and nd.context.device_type == "cpu")


def single(value: Any) -> Any:
    """The one NDArray of ``value`` (itself or a one-element list), else None."""
    if isinstance(value, (list, tuple)):
        return value[0] if len(value) == 1 else None
    return value


def as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def is_int_key(key: Any) -> bool:
    """An int key as MXNet takes them (numpy's ints too); a bool is no key."""
    return isinstance(key, numbers.Integral) and not isinstance(key, bool)


def first(value: Any, key: Any) -> Any:
    """init takes one value per key; MXNet passes a per-device list at times."""
    if isinstance(key, (list, tuple)):
        return [first(v, None) for v in value]
    return value[0] if isinstance(value, list) else value


def flatten(value: Any) -> list:
    """The arrays of ``value``, however nested in lists (one per key, one per device)."""
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in flatten(v)]
    return [value]
