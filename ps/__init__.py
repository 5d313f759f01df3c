"""ps: a pure-Python parameter server, compatible with MXNet's distributed KVStore.

Workers use :class:`KVStore`; servers and the scheduler run with ``python -m ps``.
"""
from __future__ import annotations

from . import optim
from .config import Config
from .customer import Handle
from .errors import (ClosedError, ConfigError, PeerLostError, ProtocolError, PSError,
                     PSTimeoutError, RemoteError, TransportError)
from .kvstore import KVStore, RowSparse

__version__ = "0.1.0"

__all__ = [
    "KVStore", "RowSparse", "Handle", "Config", "optim",
    "PSError", "ConfigError", "TransportError", "ClosedError", "PeerLostError",
    "PSTimeoutError", "ProtocolError", "RemoteError",
]
