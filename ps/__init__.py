"""ps: a pure-Python parameter server, compatible with MXNet's distributed KVStore.

Workers use :class:`KVStore`; servers and the scheduler run with ``python -m ps``.

The names below are imported when first used (PEP 562), so that ``python -m ps.launch``,
which needs none of them, does not pay for numpy and the worker runtime in every launcher a
job starts (about 70 ms of CPU each).
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_WHERE = {
    "KVStore": "kvstore", "RowSparse": "kvstore", "Handle": "customer", "Config": "config",
    "PSError": "errors", "ConfigError": "errors", "TransportError": "errors",
    "ClosedError": "errors", "PeerLostError": "errors", "PSTimeoutError": "errors",
    "ProtocolError": "errors", "RemoteError": "errors",
}

__all__ = [
    "KVStore", "RowSparse", "Handle", "Config", "optim",
    "PSError", "ConfigError", "TransportError", "ClosedError", "PeerLostError",
    "PSTimeoutError", "ProtocolError", "RemoteError",
]


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module("." + _WHERE[name], __name__), name)
        globals()[name] = value
        return value
    try:            # a submodule (ps.optim, ps.keys, ps.errors, ...), as when they loaded with ps
        return importlib.import_module("." + name, __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module 'ps' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
