"""A same-machine connection without libzmq: ps's frames over one Unix stream socket.

Between two processes on one machine a ZeroMQ message wakes four threads on its way (the
sender's and the receiver's libzmq I/O threads besides the two Python ones) and costs
pyzmq ~80 us of Python per round trip; over a plain Unix socket that the van's own poll
watches it wakes one. A 4 KB round trip between two processes took 145 us this way against
270 us over ZeroMQ's ipc:// on the same machine. The van's I/O thread reads a Stream; writes
(and closes) hold the van's send lock, so that a worker's thread may write a request itself
(``Streams.write_now``, ps/van/streams.py) instead of waking the I/O thread to do it, and a
stream's reading lock lets the thread that waits for the reply read it itself
(``Streams.read_here``).

On the wire a message is a header, ``<I`` (the number of frames) then ``<Q`` per frame
(its length), then the frames' bytes. A stream's first message is its opener's identity
(one frame), so that replies go back by identity as a ROUTER's would (``ZmqVan``).
"""
from __future__ import annotations

import collections
import itertools
import select
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from ..errors import ProtocolError
from ..message import MAX_ENTRIES

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
        self._big: Any = None   # a DIRECT frame being read (numpy uint8), and how much of it is in
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
                import numpy as np  # here: a scheduler, which imports this module, never needs it
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
