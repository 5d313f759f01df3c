"""A node's ROUTER: the one socket every peer sends to, its options, and where it listens.

It binds the address the node registers (tcp://, or ipc:// for a job on one machine), an
ipc:// twin beside a tcp:// address (peers on this machine skip the TCP stack: a 64 MB round
costs ~30% less CPU, with the same socket, identity routing and CURVE keys), and inproc:// for
the vans of its own process (the joint role's worker reaches its server shard there).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

import zmq

from ..errors import TransportError
from . import in_process
from .twin import new_ipc_path

logger = logging.getLogger(__name__)

Curve = tuple[bytes, bytes]     # (public key, secret key), ps/_security.py


class Listening(NamedTuple):
    socket: zmq.Socket
    address: str                # what the node registers with the scheduler
    local_address: str | None   # the ipc:// twin of a tcp:// address, for peers on this machine
    ipc_path: str | None        # the file behind an ipc:// address, removed at the end


class Where(NamedTuple):
    """What the node asked to bind."""

    host: str
    port: int = 0                             # 0: any (of ``port_range``, if given)
    port_range: tuple[int, int] | None = None
    ipc: bool = False                         # ipc:// instead of tcp:// (a job on one machine)
    twin: bool = True                         # an ipc:// twin beside a tcp:// address
    in_process: bool = False                  # inproc:// too, for this process's vans


def tune(sock: zmq.Socket, curve: Curve | None) -> None:
    """Every socket of a van: never drop or block (flow control is the protocol's job),
    no linger, and CURVE keys on a DEALER."""
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    if curve and sock.socket_type == zmq.DEALER:
        sock.curve_serverkey = curve[0]
        sock.curve_publickey, sock.curve_secretkey = curve


def listen(ctx: zmq.Context, where: Where, identity: bytes, max_msg_size: int, curve: Curve | None,
           stream_listen: Callable[[str], None] | None) -> Listening:
    """The bound ROUTER; TransportError naming the address if it cannot bind.
    ``stream_listen`` binds the Unix stream socket beside an ipc:// path (ps/van/twin.py)."""
    router = ctx.socket(zmq.ROUTER)
    tune(router, curve)
    if curve:
        router.curve_server = True
        router.curve_publickey, router.curve_secretkey = curve
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    # a peer that reopened its connection to us (we are a restart at its old address)
    # takes its identity over instead of being refused while the old one lingers
    router.setsockopt(zmq.ROUTER_HANDOVER, 1)
    router.setsockopt(zmq.MAXMSGSIZE, max_msg_size)
    ipc_path = new_ipc_path(stream_listen) if where.ipc else None
    try:
        address = _bind(router, where, ipc_path)
    except zmq.ZMQError as exc:
        router.close(linger=0)
        host, port, span = where.host, where.port, where.port_range
        at = f"{host}:{port}" if port else (f"{host} ports {span[0]}-{span[1]}" if span else f"{host} (any port)")
        raise TransportError(f"cannot bind {at}: {exc.strerror} (errno {exc.errno}); "
                             "is the port taken or the address not on this host?") from None
    local_address = None
    if not where.ipc and where.twin:
        path = new_ipc_path(stream_listen)
        try:
            router.bind(f"ipc://{path}")
            ipc_path, local_address = path, f"ipc://{path}"
        except zmq.ZMQError as exc:
            logger.debug("no ipc:// twin for %s: %s", address, exc.strerror)
    if where.in_process:
        inproc = f"inproc://{identity.decode()}"
        router.bind(inproc)
        in_process.register([address, local_address], inproc)
    return Listening(router, address, local_address, ipc_path)


def _bind(router: zmq.Socket, where: Where, ipc_path: str | None) -> str:
    if ipc_path is not None:
        router.bind(f"ipc://{ipc_path}")
    elif where.port:
        router.bind(f"tcp://{where.host}:{where.port}")
    elif where.port_range:
        low, high = where.port_range
        router.bind_to_random_port(f"tcp://{where.host}", low, high + 1, max_tries=200)
    else:
        router.bind(f"tcp://{where.host}:*")
    return router.getsockopt_string(zmq.LAST_ENDPOINT)
