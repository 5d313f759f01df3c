"""A same-machine connection without libzmq: ps's frames over one Unix stream socket.

Between two processes on one machine a ZeroMQ message wakes four threads on its way (the
sender's and the receiver's libzmq I/O threads besides the two Python ones) and costs
pyzmq ~80 us of Python per round trip; over a plain Unix socket that the van's own poll
watches it wakes one. A 4 KB round trip between two processes took 145 us this way against
270 us over ZeroMQ's ipc:// on the same machine. The van's I/O thread reads a Stream; writes
(and closes) hold the van's send lock, so that a worker's thread may write a request itself
(``Streams.write_now``) instead of waking the I/O thread to do it, and a stream's reading
lock lets the thread that waits for the reply read it itself (``Streams.read_here``).

On the wire a message is a header, ``<I`` (the number of frames) then ``<Q`` per frame
(its length), then the frames' bytes. A stream's first message is its opener's identity
(one frame), so that replies go back by identity as a ROUTER's would (``ZmqVan``).
"""
from __future__ import annotations

import collections
import itertools
import logging
import math
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ProtocolError
from ..message import MAX_ENTRIES

logger = logging.getLogger(__name__)

COUNT = struct.Struct("<I")
LENGTH = struct.Struct("<Q")
MAX_FRAMES = 2 * MAX_ENTRIES + 1    # frames of one message: the meta, and up to two per entry
DIRECT = 1 << 16            # bytes: a frame this large is read straight into its own buffer
BUFFER = 1 << 18            # bytes read per recv for smaller frames
IOV_MAX = 512               # buffers per sendmsg (Linux allows 1024)
READS = 64                  # recv calls per wake-up, so that one busy peer cannot starve the rest
SOCKET_BUFFER = 1 << 22     # SO_SNDBUF asked for (the kernel caps it at net.core.wmem_max)
COPIED_BELOW = 1 << 16      # bytes: a frame this small that must wait for the socket is copied,
                            # as pyzmq copies it (BufferGuard lends only larger ones to a reply)
POLLIN, POLLOUT, POLLERR = 1, 2, 4     # zmq_poll's flags (ZMQ_POLLIN...), for plain descriptors too
NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)   # Linux: EPIPE, not SIGPIPE (Python ignores it anyway)
AVAILABLE = hasattr(socket, "AF_UNIX") and hasattr(select, "epoll")
READ_EVENTS = 256           # streams handled per look at the readable ones

OnSent = Callable[[Any], None]


class StreamClosed(Exception):
    """The peer closed its end (or died)."""


def tune(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    except OSError:
        pass
    sock.setblocking(False)


class Stream:
    """One connection's framing: whole messages out (what the kernel did not take waits
    in order for ``flush``), whole messages in."""

    def __init__(self, sock: socket.socket, max_frame: int):
        tune(sock)
        self.sock = sock
        self.fd = sock.fileno()
        self.peer: Any = None               # the identity (server side) or node id (client side)
        self.closed = False
        # held by whoever reads: the I/O thread, or a caller waiting for its own reply
        # (Streams.read_here), who then also closes the socket if the stream closed meanwhile
        self.reading = threading.RLock()
        self.lendable = False               # opened by this van: read through Streams._reads
        self._max_frame = max_frame
        self._out: collections.deque[memoryview] = collections.deque()
        self._offered = 0                   # bytes ever given to send, headers included
        self._written = 0                   # of them, bytes the kernel took
        self._callbacks: collections.deque[tuple[int, OnSent]] = collections.deque()
        self._buf = bytearray(BUFFER)
        self._lo = self._hi = 0             # unparsed bytes are _buf[_lo:_hi]
        self._lengths: list[int] | None = None   # the message being read: its frames' lengths
        self._frames: list[Any] = []        # and the frames read so far
        self._big: np.ndarray | None = None  # a DIRECT frame being read, and how much of it is in
        self._big_in = 0
        self._error: Exception | None = None     # met after whole messages: raised by the next receive

    # -- sending -------------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """Whether bytes wait for the socket to take them (the van then polls for POLLOUT)."""
        return bool(self._out)

    def send(self, frames: list[Any], on_sent: OnSent | None = None) -> None:
        """Write ``frames`` as one message, or queue what the kernel does not take now. The
        frames are the caller's until ``on_sent(None)``: at once if the kernel took them."""
        if len(frames) > MAX_FRAMES:
            raise ProtocolError(f"a message of {len(frames)} frames (at most {MAX_FRAMES})")
        views = [memoryview(f) for f in frames]
        head = COUNT.pack(len(views)) + b"".join(LENGTH.pack(v.nbytes) for v in views)
        views.insert(0, memoryview(head))
        self._offered += len(head) + sum(v.nbytes for v in views[1:])
        if not self._out:
            views = self._write(views)
            if not views:
                if on_sent is not None:
                    on_sent(None)
                return
        self._out.extend(memoryview(bytes(v)) if v.nbytes < COPIED_BELOW else _bytes_view(v)
                         for v in views)
        if on_sent is not None:     # once the kernel took everything up to this message's end
            self._callbacks.append((self._offered, on_sent))

    def flush(self) -> None:
        """Write what waits, as far as the kernel takes it (on POLLOUT)."""
        if self._out:
            self._write(self._out)
        while self._callbacks and self._callbacks[0][0] <= self._written:
            self._callbacks.popleft()[1](None)

    def _write(self, views: Any) -> Any:
        """Write from the head of ``views`` (a list or a deque), taking what was written off
        it (a partly written view is replaced by its rest); return it."""
        if isinstance(views, list):
            views = collections.deque(views)
        while views:
            batch = list(itertools.islice(views, IOV_MAX))
            try:
                n = self.sock.sendmsg(batch, (), NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                raise StreamClosed(f"send: {exc.strerror}") from None
            self._written += n
            short = n < sum(v.nbytes for v in batch)
            while views and n >= views[0].nbytes:
                n -= views.popleft().nbytes
            if n:
                views[0] = _bytes_view(views[0])[n:]
            if short:
                break           # the kernel took less than offered: wait for POLLOUT
        return views

    # -- receiving -----------------------------------------------------------------------
    def receive(self) -> list[list[Any]]:
        """Whole messages that arrived (each a list of frames); raise StreamClosed at the
        peer's end and ProtocolError for a header no ps node writes (the stream cannot be
        read further: the caller closes it)."""
        if self._error is not None:
            raise self._error
        done: list[list[Any]] = []
        try:
            self._read(done)
        except (StreamClosed, ProtocolError) as exc:
            if not done:
                raise
            self._error = exc       # the whole messages before it first, as ZeroMQ would
        return done

    def _read(self, done: list[list[Any]]) -> None:
        taken = 0
        for _ in range(READS):
            if done and taken >= BUFFER:
                break       # handled before more is read: few large frames alive at once, whose
                            # memory malloc then reuses (64 alive cost 4x the page faults)
            if self._big is not None:
                n = self._recv(self._big.data[self._big_in:])
                if n is None:
                    break
                taken += n
                self._big_in += n
                if self._big_in == len(self._big):
                    self._frames.append(self._big)
                    self._big = None
                    self._finish(done)
                    self._parse(done)       # empty frames after it need no bytes
                continue
            if self._hi == len(self._buf):
                self._compact()
            n = self._recv(memoryview(self._buf)[self._hi:])
            if n is None:
                break
            taken += n
            self._hi += n
            self._parse(done)

    def _recv(self, view: memoryview) -> int | None:
        try:
            n = self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            raise StreamClosed(f"receive: {exc.strerror}") from None
        if n == 0:
            raise StreamClosed("closed by the peer")
        return n

    def _compact(self) -> None:
        """Move the unparsed bytes to the front (a header larger than the buffer grows it
        first: _compact_to; a small frame fits, being under DIRECT)."""
        kept = self._hi - self._lo
        self._buf[:kept] = self._buf[self._lo:self._hi]
        self._lo, self._hi = 0, kept

    def _parse(self, done: list[list[Any]]) -> None:
        buf = self._buf
        while True:
            have = self._hi - self._lo
            if self._lengths is None:
                if have < COUNT.size:
                    return
                (count,) = COUNT.unpack_from(buf, self._lo)
                if not 0 < count <= MAX_FRAMES:
                    raise ProtocolError(f"a stream message of {count} frames (at most {MAX_FRAMES})")
                size = COUNT.size + count * LENGTH.size
                if have < size:
                    if size > len(buf):
                        self._compact_to(size)
                        buf = self._buf
                    return
                lengths = list(struct.unpack_from(f"<{count}Q", buf, self._lo + COUNT.size))
                big = max(lengths)
                if big > self._max_frame:
                    raise ProtocolError(f"a stream frame of {big} bytes (at most {self._max_frame})")
                self._lo += size
                self._lengths, self._frames = lengths, []
                continue
            length = self._lengths[len(self._frames)]
            have = self._hi - self._lo
            if length >= DIRECT and have < length:
                big = np.empty(length, np.uint8)     # not zero-filled: the bytes come next
                big[:have] = memoryview(buf)[self._lo:self._hi]
                self._lo = self._hi = 0
                self._big, self._big_in = big, have
                return
            if have < length:
                if self._lo + length > len(buf):
                    self._compact()
                    buf = self._buf
                return
            self._frames.append(bytes(buf[self._lo:self._lo + length]))
            self._lo += length
            self._finish(done)
            if self._lo == self._hi:
                self._lo = self._hi = 0

    def _compact_to(self, size: int) -> None:
        kept = self._hi - self._lo
        new = bytearray(max(size, BUFFER))
        new[:kept] = self._buf[self._lo:self._hi]
        self._buf, self._lo, self._hi = new, 0, kept

    def _finish(self, done: list[list[Any]]) -> None:
        if self._lengths is not None and len(self._frames) == len(self._lengths):
            done.append(self._frames)
            self._lengths, self._frames = None, []

    def close(self, linger: float = 0.0) -> None:
        """Close; with ``linger`` seconds, first write what waits (a stopping node's last
        messages), as ZeroMQ's linger would."""
        if linger > 0 and self._out:
            try:
                self.sock.settimeout(linger)
                for view in self._out:
                    self.sock.sendall(view)
            except OSError:
                pass
        self._end()
        try:
            self.sock.close()
        except OSError:
            pass

    def shut(self) -> None:
        """Closed to all but the caller reading it now (Streams.read_here), whose poll the
        shutdown wakes and who closes the socket as it leaves."""
        self._end()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _end(self) -> None:
        self.closed = True
        self._out.clear()
        callbacks, self._callbacks = self._callbacks, collections.deque()
        for _, on_sent in callbacks:        # nothing more will be sent: the arrays are free
            on_sent(None)


def _bytes_view(view: memoryview) -> memoryview:
    """``view`` as flat bytes, which can be sliced by a byte count."""
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


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
