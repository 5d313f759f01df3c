"""The DEALER sockets a ZeroMQ van opens to its peers: per node one for data (its replies come
back on it, so the I/O loop polls it) and, on request, one that only sends credits
(PS_SEND_WINDOW). Only the van's I/O thread calls these: libzmq sockets are not thread-safe.
"""
from __future__ import annotations

from collections.abc import Callable

import zmq

from . import in_process
from .base import control_identity


class Dealers:
    def __init__(self, poller: zmq.Poller, socket_for: Callable[[str], zmq.Socket], identity: bytes,
                 max_msg_size: int):
        """``socket_for(address)``: a new, tuned DEALER able to reach ``address``."""
        self._poller, self._socket_for = poller, socket_for
        self._identity, self._max_msg_size = identity, max_msg_size
        self._data: dict[int, zmq.Socket] = {}
        self._source: dict[zmq.Socket, int] = {}
        self._credit: dict[int, zmq.Socket] = {}

    def open(self, node_id: int, address: str) -> None:
        dealer = self._socket_for(address)
        dealer.setsockopt(zmq.IDENTITY, self._identity)
        dealer.setsockopt(zmq.MAXMSGSIZE, self._max_msg_size)
        dealer.connect(in_process.twin(address) or address)
        self._data[node_id] = dealer
        self._source[dealer] = node_id
        self._poller.register(dealer, zmq.POLLIN)

    def open_credit(self, node_id: int, address: str) -> None:
        """The peer's ROUTER sees another identity on it and answers nothing there."""
        old = self._credit.pop(node_id, None)
        if old is not None:
            old.close(linger=0)
        dealer = self._socket_for(address)
        dealer.setsockopt(zmq.IDENTITY, control_identity(self._identity))
        dealer.connect(in_process.twin(address) or address)
        self._credit[node_id] = dealer

    def close(self, node_id: int) -> None:
        """Both of ``node_id``'s sockets, if open; what they held unsent is dropped."""
        old = self._data.pop(node_id, None)
        if old is not None:
            self._poller.unregister(old)
            self._source.pop(old, None)
            old.close(linger=0)
        credit = self._credit.pop(node_id, None)
        if credit is not None:
            credit.close(linger=0)

    def data(self, node_id: int) -> zmq.Socket | None:
        return self._data.get(node_id)

    def credit(self, node_id: int) -> zmq.Socket | None:
        return self._credit.get(node_id) if self._credit else None

    def source(self, sock: zmq.Socket) -> int:
        """The node a data socket reaches (0: not one of ours)."""
        return self._source.get(sock, 0)

    def __contains__(self, node_id: int) -> bool:
        return node_id in self._data

    def close_all(self, linger_ms: int) -> None:
        """Data sockets keep ``linger_ms`` to send what they hold; a credit is worth nothing
        once the van stops."""
        for sock in self._data.values():
            sock.close(linger=linger_ms)
        for sock in self._credit.values():
            sock.close(linger=0)
        self._data.clear()
        self._source.clear()
        self._credit.clear()
