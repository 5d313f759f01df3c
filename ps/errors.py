"""Exceptions raised by ps.

The tree (catch ``PSError`` to catch them all)::

    PSError
    ├── ConfigError          a DMLC_*/PS_* variable is missing or malformed
    ├── TransportError
    │   ├── ClosedError      this node already closed its store / van
    │   └── PeerLostError    another node died or left (names the node)
    ├── PSTimeoutError       a bounded wait ran out (also a TimeoutError)
    ├── ProtocolError        a malformed message (logged and dropped by nodes)
    │   └── NativeNodeError  a native MXNet (ps-lite) node tried to join: ends the job
    ├── RemoteError          a server rejected a request (bad key, shape, dtype...)
    └── CollectiveError      a Horovod-style collective cannot run (also a RuntimeError)
        └── MismatchError    ...because the workers disagree on it (also a ValueError)
"""
from __future__ import annotations


class PSError(Exception):
    """Base class of every error ps raises on purpose."""


class ConfigError(PSError, ValueError):
    """A configuration value (usually an environment variable) is missing or invalid."""


class TransportError(PSError):
    """Sending or receiving failed."""


class ClosedError(TransportError):
    """The store or node was closed by this process."""


class PeerLostError(TransportError):
    """Another node of the job died, or left before the call could complete."""

    def __init__(self, message: str, node: str | None = None):
        super().__init__(message)
        self.node = node


class PSTimeoutError(PSError, TimeoutError):
    """A bounded wait ran out; the message says what was waited for."""


class ProtocolError(PSError):
    """A message could not be decoded or violates the protocol."""


class NativeNodeError(ProtocolError):
    """MXNet's own C++ kvstore (ps-lite's wire protocol) reached a ps node: its script
    imported mxnet without ps. Not a stray packet to drop: that node would wait forever."""

    def __init__(self, message: str, role: str = "node", host: str = "", port: int = 0):
        super().__init__(message)
        self.role, self.host, self.port = role, host, port


class RemoteError(PSError):
    """A server refused a request; the cluster keeps serving everyone else."""

    def __init__(self, message: str, kind: str = "RemoteError", node: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.node = node


class CollectiveError(PSError, RuntimeError):
    """A collective (ps.torch, ps.mxnet's Horovod calls) cannot run. A RuntimeError, as
    Horovod's ``HorovodInternalError`` is, so scripts written for Horovod catch it."""


class MismatchError(CollectiveError, ValueError):
    """The workers called a collective with different names, shapes, dtypes or root ranks.
    Raised on every worker alike, so they stay in step for the next call."""
