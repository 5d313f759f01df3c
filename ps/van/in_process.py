"""Vans of one process that talk to each other (a joint process's worker and its own server,
ps/joint.py): one ZeroMQ context shared by them and never terminated, and which addresses
belong to a van of this process, so that a connection to one goes over inproc:// (a pointer
handed between threads) instead of every byte through a Unix or TCP socket."""
from __future__ import annotations

import threading

import zmq

_lock = threading.Lock()
_context: zmq.Context | None = None
_twins: dict[str, str] = {}     # a shared-context ROUTER's tcp:// and ipc:// address -> its inproc:// twin


def context() -> zmq.Context:
    """The process's shared context (made on first use)."""
    global _context
    with _lock:
        if _context is None:
            _context = zmq.Context(io_threads=1)
        return _context


def register(addresses: list[str | None], inproc: str) -> None:
    """``addresses`` (a router's own; None skipped) are reachable over ``inproc``."""
    with _lock:
        for address in addresses:
            if address:
                _twins[address] = inproc


def unregister(addresses: list[str | None]) -> None:
    with _lock:
        for address in addresses:
            _twins.pop(address, None)


def twin(address: str) -> str | None:
    """The inproc:// endpoint of a van of this process listening at ``address``, else None."""
    return _twins.get(address)
