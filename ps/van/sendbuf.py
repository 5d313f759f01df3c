"""How many bytes a peer's TCP connection still has to send (PS_SEND_LOWAT): the kernel's
count, read with the SIOCOUTQNSD ioctl on the connection's socket. libzmq does not say which
socket a peer's connection is; the file descriptor a message came in on (ZMQ_SRCFD) does, so a
connection is known once its peer has spoken."""
from __future__ import annotations

import struct
from typing import Any

import zmq

SIOCOUTQNSD = 0x894B       # Linux ioctl: bytes in a TCP socket's send queue not yet sent

try:
    import fcntl
except ImportError:        # pragma: no cover - not on Windows: unsent() cannot tell
    fcntl = None


class SendBuffers:
    """peer (node id, or ROUTER identity) -> its connection's socket; read-only on sockets
    that libzmq's I/O thread owns."""

    def __init__(self) -> None:
        self._fds: dict[Any, int] = {}

    def note(self, peer: Any, frame: zmq.Frame) -> None:
        """``frame`` came from ``peer`` (only for messages that decoded: garbage from strangers
        adds no entries); libzmq refuses ZMQ_SRCFD for some frames (EINVAL): the entry then
        stays as it was."""
        try:
            self._fds[peer] = frame.get(zmq.SRCFD)
        except zmq.ZMQError:
            pass

    def forget(self, peer: Any) -> None:
        self._fds.pop(peer, None)

    def unsent(self, peer: Any) -> int | None:
        """None until a message came from the peer, for ipc:// peers, and where the ioctl does
        not exist (not Linux): the caller then does not wait."""
        fd = self._fds.get(peer)
        if fd is None or fcntl is None:
            return None
        try:
            return struct.unpack("i", fcntl.ioctl(fd, SIOCOUTQNSD, b"\0\0\0\0"))[0]
        except OSError:         # not a TCP socket (ipc://), or closed by a reconnect
            return None
