"""A van's set of same-machine streams (ps/van/stream.py's ``Stream`` is one connection):
the socket it listens on, the streams it opened and those opened to it, on the van's I/O
thread, but for a caller's own write (``write_now``) and its own read of its reply
(``read_here``)."""
from __future__ import annotations

import logging
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import ProtocolError
from .stream import POLLERR, POLLIN, POLLOUT, OnSent, Stream, StreamClosed

logger = logging.getLogger(__name__)

READ_EVENTS = 256           # streams handled per look at the readable ones


class Streams:
    """A van's connections to peers on its machine, on its I/O thread but for
    ``write_now`` and ``read_here``: the socket it listens on, the streams it opened (by the
    peer's node id) and those peers opened to it (by the opener's identity, which their first
    message gives: a reconnect with the same identity takes the route over, as ZeroMQ's
    ROUTER_HANDOVER does).

    The van's poll sees the reads of the streams it opened through one epoll set
    (``_reads``), and such a stream's descriptor itself only while it has bytes to write
    (POLLOUT): a caller can take a stream out of that set at once, from its own thread, so
    that its reply wakes it and not the I/O thread, which a change to the zmq poll it sleeps
    in would not reach. Streams opened to the van (a server's from its workers) stay in the
    zmq poll: a look at the set is one more system call per wake-up."""

    def __init__(self, poller: Any, identity: bytes,
                 received: Callable[[list[Any], bytes | None, int | None], None],
                 lost: Callable[[int, str], None], max_frame: int,
                 lock: threading.RLock, call_soon: Callable[[Callable[[], None]], None]):
        """``poller`` is the van's zmq.Poller (it polls plain file descriptors too);
        ``received(frames, route, source)`` gets each message: ``route`` the identity of a
        stream a peer opened, ``source`` the node id of one this van opened; ``lost(node_id,
        why)`` hears that a stream this van opened closed (not by ``close_to``). ``lock``:
        the van's send lock, held here around every write and close; ``call_soon`` runs a
        function on the I/O thread (``write_now``'s rest of a message)."""
        self.lock = lock
        self._call_soon = call_soon
        self._poller = poller
        self._identity = identity
        self._received = received
        self._lost = lost
        self._max_frame = max_frame
        self._name = f"pid {os.getpid()}"
        self._by_fd: dict[int, Stream] = {}
        self._to: dict[int, Stream] = {}            # node id -> the stream this van opened
        self._routes: dict[bytes, Stream] = {}      # identity -> a stream a peer opened
        self._listener: socket.socket | None = None
        self._path: str | None = None
        self._reads = select.epoll()
        self._poller.register(self._reads.fileno(), POLLIN)

    def __len__(self) -> int:
        return len(self._by_fd)

    def listen(self, path: str) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(256)
        except OSError as exc:
            listener.close()
            logger.debug("%s: no stream socket at %s: %s", self._name, path, exc.strerror)
            return
        listener.setblocking(False)
        self._listener, self._path = listener, path
        self._poller.register(listener.fileno(), POLLIN)

    def open(self, node_id: int, path: str) -> bool:
        """Connect to the stream socket of ``node_id`` at ``path``; False if none answers
        or it closes at once (the van then uses ZeroMQ)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(1.0)
            sock.connect(path)
        except OSError as exc:
            sock.close()
            logger.debug("%s: no stream at %s: %s", self._name, path, exc)
            return False
        stream = self._add(sock, lendable=True)
        stream.peer = node_id
        self._to[node_id] = stream
        return self.send(stream, [self._identity])  # who we are: replies come back by it (False:
                                                    # the peer closed at once, as the hello left)

    def to(self, node_id: int) -> Stream | None:
        return self._to.get(node_id) if self._to else None

    def routed(self, route: bytes) -> Stream | None:
        return self._routes.get(route) if self._routes else None

    def close_to(self, node_id: int) -> None:
        stream = self._to.pop(node_id, None)
        if stream is not None:
            self._close(stream, "disconnected", lost=False)

    def send(self, stream: Stream, frames: list[Any], on_sent: OnSent | None = None) -> bool:
        """False if the stream is closed (its peer died): the message is dropped."""
        with self.lock:
            if stream.closed:
                return False
            try:
                stream.send(frames, on_sent)
            except StreamClosed as exc:
                self._close(stream, str(exc))
                return False
            if stream.pending:
                self._watch(stream, POLLOUT)
            return True

    def idle_to(self, node_id: int) -> bool:
        """Whether a stream to ``node_id`` is open with nothing waiting to be written (a
        look without the lock: ``write_now`` looks again under it)."""
        return self._idle(node_id) is not None

    def _idle(self, node_id: int) -> Stream | None:
        stream = self._to.get(node_id) if self._to else None
        return None if stream is None or stream.closed or stream.pending else stream

    def write_now(self, node_id: int, frames: list[Any], on_sent: OnSent | None = None) -> bool:
        """On a thread other than the I/O thread, holding ``lock``: write a message to the
        stream opened to ``node_id`` if one is open and nothing of it waits to be written.
        What the kernel does not take now the I/O thread writes on (it is woken for that
        only). False: nothing was written, the I/O thread must send it (and it meets any
        error the stream has, closing it as its own sends do)."""
        stream = self._idle(node_id)
        if stream is None:
            return False
        try:
            stream.send(frames, on_sent)
        except StreamClosed:
            return False
        if stream.pending:
            self._call_soon(lambda: self._want_out(stream))
        return True

    def _want_out(self, stream: Stream) -> None:
        with self.lock:
            if not stream.closed and stream.pending:
                self._watch(stream, POLLOUT)

    def on_event(self, fd: int, events: int) -> None:
        """The poll's ``events`` for ``fd``: the read set's, a stream's (POLLOUT), the
        listener's, or one closed earlier in the same pass of the poll's results."""
        if fd == self._reads.fileno():
            for ready, _ in self._reads.poll(0, READ_EVENTS):
                stream = self._by_fd.get(ready)
                if stream is not None:
                    self._on_stream(stream, POLLIN)
            return
        stream = self._by_fd.get(fd)
        if stream is None:
            if self._listener is not None and fd == self._listener.fileno():
                self._accept()
            return
        self._on_stream(stream, events)

    def _on_stream(self, stream: Stream, events: int) -> None:
        try:
            if events & POLLOUT:
                with self.lock:
                    stream.flush()
                    if not stream.pending:
                        self._watch(stream, 0)
            # a caller reading its reply holds ``reading`` (an event from before it took
            # the stream out of the read set): it reads on
            if events & (POLLIN | POLLERR) and stream.reading.acquire(blocking=False):
                try:
                    for frames in stream.receive():
                        self._take(stream, frames)
                finally:
                    stream.reading.release()
        except StreamClosed as exc:
            self._close(stream, str(exc))
        except ProtocolError as exc:
            logger.warning("%s: closed a stream that sent a malformed message: %s", self._name, exc)
            self._close(stream, str(exc))
        except Exception as exc:  # noqa: BLE001 - e.g. MemoryError for a frame: this stream, not the van
            logger.exception("%s: closed a stream after an error", self._name)
            self._close(stream, repr(exc))

    def read_here(self, node_id: int, until: Callable[[], bool], seconds: float,
                  take: Callable[[list[list[Any]]], bool]) -> bool:
        """On a caller's thread, waiting for its reply from ``node_id``: read the stream to
        it here until ``until()`` or ``seconds`` pass, giving each batch of whole messages
        to ``take`` (False: stop, it handed them to the I/O thread). The reply then wakes
        this thread alone, not the I/O thread first, which would wake this one (two thread
        switches on a small round's path). False: wait as usual, for nothing more is read
        here (no stream, another thread reads it, it broke, or ``take`` handed messages on)."""
        stream = self._to.get(node_id) if self._to else None
        if stream is None or stream.closed or not stream.reading.acquire(blocking=False):
            return False
        broken: str | None = None
        kept = False
        try:
            if stream.closed:
                return False
            try:
                self._reads.unregister(stream.fd)
            except (OSError, ValueError):   # ValueError: the van closed the set (it stopped)
                return False
            broken, kept = _read_until(stream, until, seconds, take)
        finally:
            with self.lock:         # _close decides under it whether the socket is ours to close
                if stream.closed:
                    stream.close()
                elif broken is None:
                    self._reads.register(stream.fd, select.EPOLLIN)
                stream.reading.release()
        if broken is not None:
            self._call_soon(lambda: self._close(stream, broken))
        return kept

    def _take(self, stream: Stream, frames: list[Any]) -> None:
        if stream.peer is None:
            if len(frames) != 1 or not 0 < len(frames[0]) <= 255:
                raise ProtocolError("a stream's first message must be its opener's identity")
            stream.peer = bytes(frames[0])
            self._routes[stream.peer] = stream
        elif isinstance(stream.peer, bytes):
            self._received(frames, stream.peer, None)
        else:
            self._received(frames, None, stream.peer)

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # e.g. out of file descriptors: the listener would stay readable and the loop
                # spin; peers that come later find no stream and use ZeroMQ
                logger.warning("%s: accepting a stream failed (%s): no more streams to this process",
                               self._name, exc.strerror)
                self._poller.unregister(self._listener.fileno())
                self._listener.close()
                self._listener = None
                return
            self._add(sock)

    def _add(self, sock: socket.socket, lendable: bool = False) -> Stream:
        stream = Stream(sock, self._max_frame)
        self._by_fd[stream.fd] = stream
        stream.lendable = lendable
        if lendable:
            self._reads.register(stream.fd, select.EPOLLIN)
        self._watch(stream, 0)
        return stream

    def _watch(self, stream: Stream, out: int) -> None:
        """What the zmq poll watches ``stream`` for: ``out`` (POLLOUT or 0), and POLLIN
        unless its reads go through ``_reads``."""
        self._poller.register(stream.fd, out | (0 if stream.lendable else POLLIN))

    def _close(self, stream: Stream, why: str, lost: bool = True) -> None:
        if stream.closed:
            return
        logger.debug("%s: the stream with %r closed: %s", self._name, stream.peer, why)
        self._poller.register(stream.fd, 0)
        if stream.lendable:
            try:
                self._reads.unregister(stream.fd)
            except (OSError, ValueError):
                pass                # a caller has it out of the set (read_here), or the van stopped
        self._by_fd.pop(stream.fd, None)
        self._end(stream)
        if isinstance(stream.peer, bytes):
            if self._routes.get(stream.peer) is stream:
                del self._routes[stream.peer]
        elif stream.peer is not None and self._to.get(stream.peer) is stream:
            del self._to[stream.peer]
            if lost:
                self._lost(stream.peer, why)

    def close(self, linger: float = 0.0) -> None:
        """Close every stream (writing what waits for up to ``linger`` s) and the listener."""
        with self.lock:
            for stream in list(self._by_fd.values()):
                self._end(stream, linger)
            self._to.clear()
        self._by_fd.clear()
        self._routes.clear()
        self._poller.register(self._reads.fileno(), 0)
        self._reads.close()
        if self._path is not None:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            try:
                os.unlink(self._path)
            except OSError:
                pass

    def _end(self, stream: Stream, linger: float = 0.0) -> None:
        """Close ``stream``; if a caller reads it now (read_here), shut it: the caller's poll
        wakes and the caller closes the socket."""
        with self.lock:
            if stream.reading.acquire(blocking=False):
                try:
                    stream.close(linger)
                finally:
                    stream.reading.release()
            else:
                stream.shut()


def _read_until(stream: Stream, until: Callable[[], bool], seconds: float,
                take: Callable[[list[list[Any]]], bool]) -> tuple[str | None, bool]:
    """Streams.read_here's loop; returns why the stream broke (or None), and whether the
    caller may read here again (nothing broke or went to the I/O thread)."""
    waiter = select.poll()
    waiter.register(stream.fd, select.POLLIN)
    end = time.monotonic() + seconds
    while not until():
        left = end - time.monotonic()
        if left <= 0 or stream.closed:
            return None, not stream.closed
        if not waiter.poll(math.ceil(left * 1000)) or stream.closed:
            continue
        try:
            batch = stream.receive()
        except (StreamClosed, ProtocolError) as exc:
            return str(exc), False
        except Exception as exc:    # e.g. MemoryError for a frame: the stream's end, not the caller's
            logger.exception("a stream read on a caller's thread failed")
            return repr(exc), False
        if batch and not take(batch):
            return None, False
    return None, True
