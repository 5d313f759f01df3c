"""Transports: ``zmq`` (ZeroMQ over tcp:// or ipc://) and ``inproc`` (queues, one process)."""
from __future__ import annotations

from .base import Van


def create_van(kind: str = "zmq", **kwargs) -> Van:
    if kind == "zmq":
        from .zmq_van import ZmqVan
        return ZmqVan(**kwargs)
    if kind == "inproc":
        from .inproc_van import InprocVan
        return InprocVan(**kwargs)
    raise ValueError(f"unknown van kind {kind!r}; use 'zmq' or 'inproc'")


def reliable(inner: Van, config) -> Van:
    """Wrap ``inner`` for PS_RESEND: acks, resends, in-order exactly-once delivery."""
    if not config.resend:
        return inner
    from .reliable import ReliableVan
    timeout = config.resend_timeout / 1000.0
    return ReliableVan(inner, timeout, give_up=max(config.heartbeat_timeout, 30 * timeout))


__all__ = ["Van", "create_van", "reliable"]
