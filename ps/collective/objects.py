"""What ``broadcast_object`` and ``allgather_object`` send: any object, as Horovod's, when
the job has a signing key; plain data otherwise.

Horovod pickles the object. The bytes come back through the servers, and anyone who can
reach a server could put their own there, so ps unpickles only what the sending worker
signed with the job's key (``PS_JOB_KEY_FILE``, which ``python -m ps.launch`` writes, or
``PS_SECRET_FILE``) and checks that signature first, as it does for a pickled MXNet
optimizer (docs/security.md). Without a key (a bare ``mpirun``), objects travel as msgpack:
dicts (any scalar keys), lists, tuples, sets, str, bytes, numbers, None, numpy arrays, torch
tensors and MXNet NDArrays come back as they were sent; anything else is refused by name.
Shared by ``ps.torch`` and ``ps.mxnet``'s Horovod calls; neither framework is imported here
unless a tensor of it travels.
"""
from __future__ import annotations

import collections
import hashlib
import hmac
import pickle
import sys
from typing import Any

import msgpack
import numpy as np

from .. import _security

_SIGNED, _PLAIN = b"P", b"M"
_TUPLE, _SET, _FROZENSET, _ARRAY, _TENSOR, _ORDERED, _BIGINT, _COMPLEX, _NDARRAY = range(1, 10)
_NUMERIC = set("biufc")                  # numpy kinds that carry no Python objects


def _key(kv: Any) -> bytes | None:
    cfg = kv.config
    return _security.signing_key(cfg.secret_file, cfg.job_key_file)


def dumps(obj: Any, kv: Any, what: str) -> bytes:
    """``obj`` as bytes every worker of ``kv``'s job can read back (``loads``)."""
    key = _key(kv)
    if key is not None:
        try:
            import cloudpickle
            payload = cloudpickle.dumps(obj)
        except ImportError:                 # classes of the script pickle by reference: the
            payload = pickle.dumps(obj)     # receivers run the same script
        return _SIGNED + hmac.new(key, payload, hashlib.sha256).digest() + payload
    try:
        return _PLAIN + _pack(obj)
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}. Without a job key ps sends only plain data (dict, list, tuple, set, "
                        "str, bytes, numbers, None, numpy arrays, torch tensors, MXNet NDArrays), as it unpickles "
                        f"nothing unsigned; for any object, {_security.NO_KEY}") from None


def loads(data: bytes, kv: Any, what: str) -> Any:
    kind, body = data[:1], data[1:]
    if kind == _SIGNED:
        key = _key(kv)
        digest, payload = body[:32], body[32:]
        if key is None or not hmac.compare_digest(hmac.new(key, payload, hashlib.sha256).digest(), digest):
            raise PermissionError(f"{what}: the object's signature does not match this job's key: not unpickled")
        return pickle.loads(payload)        # noqa: S301 - signed by a worker of this job
    if kind == _PLAIN:
        return _unpack(body)
    raise ValueError(f"{what}: received {len(data)} bytes that are no object ps sent")


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_encode, strict_types=True, use_bin_type=True)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_decode, strict_map_key=False, raw=False, use_list=True)


def _array(a: np.ndarray) -> list:
    if a.dtype.kind not in _NUMERIC:
        raise TypeError(f"a numpy array of dtype {a.dtype} cannot travel as plain data")
    return [a.dtype.str, list(a.shape), np.ascontiguousarray(a).tobytes()]


def _from_bytes(dtype: str, shape: list, raw: bytes) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind not in _NUMERIC:
        raise ValueError(f"not a numeric dtype: {dtype!r}")
    return np.frombuffer(raw, dt).reshape(shape).copy()


def _encode(obj: Any) -> Any:
    if isinstance(obj, bool) or obj is None:
        return obj
    if isinstance(obj, int):
        if -(1 << 63) <= obj < (1 << 64):
            return int(obj)
        return msgpack.ExtType(_BIGINT, str(int(obj)).encode())
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, (bytes, bytearray)):
        return bytes(obj)
    if isinstance(obj, complex):
        return msgpack.ExtType(_COMPLEX, _pack([obj.real, obj.imag]))
    if isinstance(obj, tuple):
        return msgpack.ExtType(_TUPLE, _pack(list(obj)))
    if isinstance(obj, frozenset):
        return msgpack.ExtType(_FROZENSET, _pack(list(obj)))
    if isinstance(obj, set):
        return msgpack.ExtType(_SET, _pack(list(obj)))
    if isinstance(obj, collections.OrderedDict):
        return msgpack.ExtType(_ORDERED, _pack([list(kv) for kv in obj.items()]))
    if isinstance(obj, dict):
        return dict(obj)
    if isinstance(obj, list):
        return list(obj)
    torch, mx = sys.modules.get("torch"), sys.modules.get("mxnet")     # only if the script uses them
    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        dtype = str(t.dtype).replace("torch.", "")
        if t.dtype == torch.bfloat16:
            t = t.to(torch.float32)
        return msgpack.ExtType(_TENSOR, _pack([dtype, *_array(t.contiguous().numpy())]))
    if mx is not None and isinstance(obj, mx.nd.NDArray):
        return msgpack.ExtType(_NDARRAY, _pack(_array(obj.asnumpy())))
    if isinstance(obj, np.ndarray):
        return msgpack.ExtType(_ARRAY, _pack(_array(obj)))
    if isinstance(obj, np.generic):
        return msgpack.ExtType(_ARRAY, _pack(_array(np.asarray(obj))))
    raise TypeError(f"an object of type {type(obj).__module__}.{type(obj).__qualname__} cannot travel as "
                    "plain data")


def _decode(code: int, data: bytes) -> Any:
    if code == _BIGINT:
        return int(data.decode())
    value = _unpack(data)
    if code == _TUPLE:
        return tuple(value)
    if code == _SET:
        return set(value)
    if code == _FROZENSET:
        return frozenset(value)
    if code == _ORDERED:
        return collections.OrderedDict((k, v) for k, v in value)
    if code == _COMPLEX:
        return complex(*value)
    if code == _ARRAY:
        a = _from_bytes(*value)
        return a[()] if not a.shape else a
    if code == _NDARRAY:
        a = _from_bytes(*value)
        return _framework("mxnet").nd.array(a, dtype=a.dtype)
    if code == _TENSOR:
        name, *array = value
        torch = _framework("torch")
        dtype = getattr(torch, str(name), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"not a torch dtype: {name!r}")
        return torch.from_numpy(_from_bytes(*array)).to(dtype)
    raise ValueError(f"unknown msgpack extension {code}")


def _framework(name: str) -> Any:
    """The framework a received tensor belongs to (the sender's script uses it, so this one
    does too), or a clear error."""
    try:
        return __import__(name)
    except ImportError:
        raise ValueError(f"an object with a {name} tensor arrived, but {name} is not installed here") from None
