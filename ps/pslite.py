"""Recognizing ps-lite's wire protocol, so a native MXNet node is named, not dropped.

A process that imports plain mxnet and creates a ``dist_*`` kvstore runs MXNet's C++
ps-lite client: it connects to ``DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT`` like any ps node,
but its messages are ps-lite's protobuf ``PBMeta``, not ps's msgpack. We read just enough of
that protobuf (no dependency, a few fields) to say which role, from where, and how to fix it.
"""
from __future__ import annotations

from .errors import NativeNodeError

ROLES = {0: "server", 1: "worker", 2: "scheduler"}      # ps-lite's Node::Role
FIX = ("its script imports mxnet without ps, so MXNet's own C++ kvstore (ps-lite) answered "
       "kvstore='dist_*'. Start the job with `python -m ps.launch` (unless PS_MXNET_AUTOLOAD=0), set "
       "PYTHONPATH=$(python -m ps --mxnet-autoload-path) for processes started by hand, or put "
       "`import ps.mxnet` before `import mxnet` in the script (see docs/mxnet.md)")


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of a whole protobuf message; ValueError if it is not one."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ValueError("field 0")
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ValueError("truncated field")
            value, i = buf[i:i + n], i + n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            value, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wire}")
        out.append((field, value))
    return out


def native_node(frame: bytes) -> NativeNodeError | None:
    """The error naming the native MXNet node that sent ``frame``, if it is ps-lite's
    ``PBMeta`` (field 1 ``head``, field 3 ``control`` with its nodes); else None."""
    if not frame or frame[0] != 0x08:           # ps's meta is a msgpack array: never 0x08
        return None
    try:
        meta = _fields(bytes(frame))
        control = next((v for f, v in meta if f == 3 and isinstance(v, bytes)), None)
        if meta[0][0] != 1 or control is None:
            return None
        nodes = [v for f, v in _fields(control) if f == 2 and isinstance(v, bytes)]
        node = dict(_fields(nodes[0])) if nodes else {}
    except (ValueError, IndexError):
        return None
    role = ROLES.get(node.get(1) if isinstance(node.get(1), int) else -1, "node")
    host = node.get(3).decode("utf-8", "replace") if isinstance(node.get(3), bytes) else "?"
    port = node.get(4) if isinstance(node.get(4), int) else 0
    return NativeNodeError(f"a native MXNet kvstore {role} at {host}:{port} tried to join this ps job: {FIX}",
                           role, host, port)
