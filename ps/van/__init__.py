"""Transports: ``zmq`` (ZeroMQ over tcp:// or ipc://) and ``inproc`` (queues, one process);
``zmq-tcp`` is ``zmq`` without the ipc:// twin, so peers on one machine talk as over a network."""
from __future__ import annotations

from .base import Van, control_identity


def create_van(kind: str = "zmq", **kwargs) -> Van:
    if kind in ("zmq", "zmq-tcp"):
        from .zmq_van import ZmqVan
        return ZmqVan(twin=kind == "zmq", **kwargs)
    if kind == "inproc":
        from .inproc_van import InprocVan
        return InprocVan(**kwargs)
    raise ValueError(f"unknown van kind {kind!r}; use 'zmq', 'zmq-tcp' or 'inproc'")


def for_config(config, drop=None) -> Van:
    """The van a node of this config uses: ZeroMQ (ipc with DMLC_LOCAL, CURVE with
    PS_SECRET_FILE), wrapped for PS_RESEND."""
    curve = None
    if config.secret_file:
        from .._security import curve_keys, read_secret
        curve = curve_keys(read_secret(config.secret_file))
    extra = {"in_process": True} if config.in_process_peers else {}
    inner = create_van("zmq" if config.local_ipc else "zmq-tcp", ipc=config.local and not config.is_scheduler,
                       verbose=config.verbose, drop=drop, curve=curve, streams=config.local_stream,
                       **extra)
    return with_resend(inner, config)


def with_resend(inner: Van, config) -> Van:
    """Wrap ``inner`` for PS_RESEND: acks, resends, in-order exactly-once delivery. (Not
    named ``reliable``: importing the submodule of that name rebinds the package's name to
    the module, which broke every later call in the process.)"""
    if not config.resend:
        return inner
    from .reliable import ReliableVan
    timeout = config.resend_timeout / 1000.0
    return ReliableVan(inner, timeout, give_up=max(config.heartbeat_timeout, 30 * timeout),
                       adopt_fresh=config.is_scheduler)


__all__ = ["Van", "control_identity", "create_van", "for_config", "with_resend"]
