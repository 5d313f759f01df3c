"""ZeroMQ transport: one ROUTER bound per node, one DEALER per peer, one I/O thread.

libzmq sockets are not thread-safe, so only the I/O thread touches them; other
threads hand over messages through a deque and wake the loop with a pipe byte.
Array frames go out with ``copy=False`` (pyzmq still copies frames under 64 KiB,
which is cheaper than pinning them) and come back as ``zmq.Frame`` buffers.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import threading
import uuid
from typing import Any, Callable

import zmq

from ..errors import NativeNodeError, ProtocolError, TransportError
from ..message import Command, Message, decode, encode, node_name
from . import in_process
from .base import TICK_SOONEST, OnMessage, Van
from .dealers import Dealers
from .handoff import Handoff
from .router import Where, listen, tune
from .sendbuf import SendBuffers
from .stream import AVAILABLE as UNIX_SOCKETS
from .streams import Streams
from .traffic import Traffic
from .twin import stream_path
from .zmq_watch import OnEvent, Watches

logger = logging.getLogger(__name__)

MAX_MSG_SIZE = 1 << 30     # ZMQ_MAXMSGSIZE: largest single frame a node accepts
RECV_BATCH = 256           # messages taken from one socket before polling again


class ZmqVan(Van):
    def __init__(self, ipc: bool = False, verbose: int = 0,
                 drop: Callable[[Message], bool] | None = None, curve: tuple[bytes, bytes] | None = None,
                 twin: bool = True, in_process: bool = False, streams: bool = True):
        self._ipc = ipc
        self._in_process = in_process   # also reachable over inproc:// by this process's other vans
        self._twin = twin
        self._curve = curve
        self._verbose = verbose
        self._traffic = Traffic()
        self._drop = drop
        self._ctx: zmq.Context | None = None
        self._router: zmq.Socket | None = None
        # peer (node id or ROUTER identity) -> how often it was forgotten: a message queued
        # before its peer died is not sent to the peer's restart (forget, _send_now)
        self._gens: dict[Any, int] = {}
        self._identity = b"ps-" + uuid.uuid4().hex[:16].encode()
        self._handoff = Handoff()              # what other threads give the I/O thread
        # held around every write to a stream, on the I/O thread and on a caller's (send_now),
        # and across taking a message off the queue and sending it, so that a caller's write
        # never passes a message queued before it
        self._send_lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._linger = 0.0
        self._on_message: OnMessage | None = None
        self._poller = zmq.Poller()
        self._watches = Watches(self._poller, lambda: self._socket(zmq.DEALER))
        self._dealers = Dealers(self._poller, self._peer_socket, self._identity, MAX_MSG_SIZE)
        self._ipc_path: str | None = None
        self._buffers = SendBuffers()           # where unsent() looks
        self._ticks: list[Callable[[], float | None]] = []
        self.local_address: str | None = None   # ipc:// twin of a tcp:// address, for same-host peers
        # peers on this machine past libzmq (ps/van/stream.py), beside an ipc:// path; never
        # under CURVE, whose keys authenticate peers (a Unix socket has none)
        self._streams = Streams(self._poller, self._identity, self._from_stream, self._stream_lost,
                                MAX_MSG_SIZE, self._send_lock, self._soon_quietly
                                ) if streams and curve is None and UNIX_SOCKETS else None
        self._via_stream: dict[int, str] = {}   # node id -> its address, while a stream reaches it

    # -- setup ---------------------------------------------------------------------------
    def start(self, on_message: OnMessage, host: str, port: int = 0,
              port_range: tuple[int, int] | None = None, name: str = "") -> str:
        self._on_message = on_message
        self._ctx = in_process.context() if self._in_process else zmq.Context(io_threads=1)
        where = Where(host, port, port_range, self._ipc, self._twin, self._in_process)
        try:
            bound = listen(self._ctx, where, self._identity, MAX_MSG_SIZE, self._curve,
                           self._streams.listen if self._streams is not None else None)
        except TransportError:
            if not self._in_process:
                self._ctx.term()
            raise
        self._router, self.address = bound.socket, bound.address
        self.local_address, self._ipc_path = bound.local_address, bound.ipc_path
        self._poller.register(self._router, zmq.POLLIN)
        self._poller.register(self._handoff.open(), zmq.POLLIN)
        self._thread = threading.Thread(target=self._loop, name=f"ps-van[{name or self.address}]",
                                        daemon=True)
        self._thread.start()
        return self.address

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        tune(sock, self._curve)
        return sock

    def endpoint_used(self, address: str) -> str:
        return in_process.twin(address) or address

    def _peer_socket(self, address: str) -> zmq.Socket:
        """A DEALER for ``address``: from the shared context when the peer is a van of this
        process (inproc:// connects only within one context)."""
        if in_process.twin(address) is None:
            return self._socket(zmq.DEALER)
        sock = in_process.context().socket(zmq.DEALER)
        tune(sock, self._curve)
        return sock

    def connect(self, node_id: int, address: str) -> None:
        self.call_soon(lambda: self._connect_now(node_id, address))

    def _connect_now(self, node_id: int, address: str) -> None:
        self._disconnect_now(node_id)           # the credit connection too: Postoffice reopens it
        path = stream_path(self.endpoint_used(address)) if self._streams is not None else None
        if path is not None and self._streams.open(node_id, path):
            self._via_stream[node_id] = address
            if self._verbose:
                logger.info("%s: connecting to %s at %s (stream)", self.address, node_name(node_id), path)
            return
        self._connect_dealer(node_id, address)

    def _stream_lost(self, node_id: int, why: str) -> None:
        """A stream this van opened closed: its process died, or (alive) refused what we
        sent or ran out of memory. ZeroMQ's twin from then on, which reconnects by itself
        as before; a dead process's restart has another address, and Postoffice connects
        to it anew (a stream again)."""
        address = self._via_stream.pop(node_id, None)
        if address is not None:
            logger.info("%s: the stream to %s closed (%s); ZeroMQ's %s from now on", self.address,
                        node_name(node_id), why, address)
            self._connect_dealer(node_id, address)

    def _connect_dealer(self, node_id: int, address: str) -> None:
        self._dealers.open(node_id, address)
        if self._verbose:
            logger.info("%s: connecting to %s at %s", self.address, node_name(node_id), address)

    def _from_stream(self, frames: list[Any], route: bytes | None, source: int | None) -> None:
        self._traffic.received(sum(len(f) for f in frames))
        msg = self._decoded(frames, route)
        if msg is None:
            return
        if source is not None:
            msg.source = source
        self._deliver(msg)

    def watch(self, node_id: int, address: str, on_event: OnEvent) -> None:
        """Report whether the process at ``address`` is there (ps/van/zmq_watch.py)."""
        self.call_soon(lambda: self._watches.watch(node_id, address, on_event))

    def unwatch(self, node_id: int) -> None:
        self.call_soon(lambda: self._watches.unwatch(node_id))

    @property
    def identity(self) -> bytes:
        return self._identity

    @property
    def in_io_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    # -- sending -------------------------------------------------------------------------
    def transport_stats(self) -> dict[str, int]:
        """Bytes of ps messages this van sent and received (meta and data frames)."""
        return self._traffic.stats(len(self._streams) if self._streams is not None else 0)

    def forget(self, peer: Any) -> None:
        """Messages to ``peer`` queued so far are stale: they were meant for a process that
        died, and a restart at the same node id must not get them (nor their PS_RESEND
        numbers). A ReliableVan calls this under the lock it numbers messages under."""
        self._gens[peer] = self._gens.get(peer, 0) + 1
        self._buffers.forget(peer)

    def disconnect(self, node_id: int) -> None:
        self.call_soon(lambda: self._disconnect_now(node_id))

    def _disconnect_now(self, node_id: int) -> None:
        self._buffers.forget(node_id)
        if self._streams is not None:
            self._via_stream.pop(node_id, None)
            self._streams.close_to(node_id)
        self._dealers.close(node_id)

    def connect_control(self, node_id: int, address: str) -> bool:
        """Credits (PS_SEND_WINDOW) get a connection of their own: on the data connection a
        credit waits behind the megabytes of pushes (replies) this node has in that
        socket's buffers, the sender's window stays shut that long, and a link whose
        reverse direction is busy runs at a fraction of its rate (one server for several
        workers ran 1.3x slower than MXNet's FIFO that way). It only sends: the peer's
        ROUTER sees another identity and answers nothing on it."""
        self.call_soon(lambda: self._dealers.open_credit(node_id, address))
        return True

    def send(self, msg: Message) -> None:
        if self._gens:
            msg.gen = self._gens.get(_peer(msg), 0)
        if not self.in_io_thread:
            self._handoff.put(msg)
        elif self._handoff:
            # behind what other threads queued before: a worker's flush on this thread must
            # not send a push's last chunk (or the next push) ahead of its first chunks, which
            # the caller's thread queued (the server would count them in the wrong round)
            self._handoff.put_here(msg)
        else:
            self._send_now(msg)

    def send_now(self, msg: Message) -> bool:
        """Write ``msg`` on the calling thread when a stream reaches its peer and nothing is
        queued before it: a worker's lone request (``KVWorker._leaves_alone``) leaves
        without waking the I/O thread, which on a busy machine is a thread switch on every
        round's path. Bulk traffic stays with the I/O thread, whose writes overlap the
        caller's next work."""
        if self._streams is None or msg.route is not None or msg.cmd == Command.CREDIT \
                or self.in_io_thread or not self._streams.idle_to(msg.recver):
            return False
        if self._gens:
            msg.gen = self._gens.get(_peer(msg), 0)
        frames = encode(msg)
        with self._send_lock:
            if self._handoff or not self._handoff.accepting:
                return False
            if not self._streams.write_now(msg.recver, frames, msg.on_sent):
                return False
            self._sent(msg, sum(memoryview(f).nbytes for f in frames))
            self._traffic.sent_now += 1
        return True

    def read_here(self, node_id: int, until: Callable[[], bool], seconds: float,
                  mine: Callable[[Message], bool]) -> bool:
        """A worker waiting for the reply to its lone request reads it from the stream
        itself (:meth:`Streams.read_here`): the reply wakes the waiting thread, not the I/O
        thread, which would then wake the waiting one."""
        if self._streams is None or self._stopping or self.in_io_thread:
            return False
        return self._streams.read_here(node_id, until, seconds,
                                       lambda batch: self._take_here(batch, node_id, mine))

    def _take_here(self, batch: list[list[Any]], source: int, mine: Callable[[Message], bool]) -> bool:
        for i, frames in enumerate(batch):
            self._traffic.read_here += 1
            self._traffic.read_here_bytes += sum(len(f) for f in frames)
            msg = self._decoded(frames, None)
            if msg is None:
                continue
            msg.source = source
            if not mine(msg):               # in order, on the I/O thread: this one and the rest
                self._soon_quietly(functools.partial(self._deliver_all, msg, batch[i + 1:], source))
                return False
            self._deliver(msg)
        return True

    def _deliver_all(self, msg: Message, rest: list[list[Any]], source: int) -> None:
        self._deliver(msg)
        for frames in rest:
            self._from_stream(frames, None, source)

    def _soon_quietly(self, fn: Callable[[], None]) -> None:
        try:
            self._handoff.put(fn)
        except TransportError:
            pass                    # stopping: nothing more will be written anyway

    def call_soon(self, fn: Callable[[], None]) -> None:
        if self.in_io_thread:
            fn()
        else:
            self._handoff.put(fn)

    def call_later(self, fn: Callable[[], None]) -> None:
        if self.in_io_thread:
            self._handoff.put_here(fn)
        else:
            self._handoff.put(fn)

    def _send_now(self, msg: Message) -> None:
        with self._send_lock:
            self._send_locked(msg)

    def _send_locked(self, msg: Message) -> None:
        if self._gens and msg.gen != self._gens.get(_peer(msg), 0):
            self._traffic.stale += 1    # for a dead incarnation: its restart must not see it
            logger.debug("dropping %r: queued before its peer was forgotten", msg)
            _dropped(msg)
            return
        frames = encode(msg)
        nbytes = sum(memoryview(f).nbytes for f in frames)
        control = self._dealers.credit(msg.recver) if msg.cmd == Command.CREDIT else None
        if control is not None:
            sock = control
        elif msg.route is not None:
            stream = self._streams.routed(msg.route) if self._streams is not None else None
            if stream is not None:
                self._stream_sent(stream, frames, nbytes, msg)
                return
            sock, frames = self._router, [msg.route, *frames]
        else:
            stream = self._streams.to(msg.recver) if self._streams is not None else None
            if stream is not None:
                self._stream_sent(stream, frames, nbytes, msg)
                return
            sock = self._dealers.data(msg.recver)
            if sock is None:
                logger.log(logging.DEBUG if msg.recver in self._gens else logging.ERROR,
                           "dropping %r: no connection to %s", msg, node_name(msg.recver))
                _dropped(msg)
                return
        try:
            tracker = sock.send_multipart(frames, copy=False, track=msg.on_sent is not None)
        except zmq.ZMQError as exc:
            # EHOSTUNREACH: a peer that died (the scheduler names it); anything else is news
            logger.log(logging.INFO if exc.errno == zmq.EHOSTUNREACH else logging.WARNING,
                       "dropping %r: %s", msg, exc.strerror)
            _dropped(msg)
            return
        if msg.on_sent is not None:
            msg.on_sent(tracker)
        self._sent(msg, nbytes)

    def _stream_sent(self, stream: Any, frames: list[Any], nbytes: int, msg: Message) -> None:
        if not self._streams.send(stream, frames, msg.on_sent):     # on_sent: once written
            if msg.route is None and msg.recver in self._dealers:
                self._send_now(msg)     # the stream broke just now: its fallback, as the next ones
                return
            logger.log(logging.DEBUG if msg.recver in self._gens else logging.INFO,
                       "dropping %r: its stream to %r is closed", msg, stream.peer)
            _dropped(msg)
            return
        self._sent(msg, nbytes)

    def _sent(self, msg: Message, nbytes: int) -> None:
        self._traffic.sent(nbytes)
        if self._verbose >= 2:
            logger.debug("sent %r", msg)

    def unsent(self, node_id: int, route: bytes | None = None) -> int | None:
        """Bytes the connection to ``node_id`` (or ``route``) has still to send (sendbuf.py)."""
        return self._buffers.unsent(node_id if route is None else route)

    def add_tick(self, fn: Callable[[], float | None]) -> None:
        self._ticks.append(fn)

    # -- the I/O loop --------------------------------------------------------------------
    def _loop(self) -> None:
        watches = self._watches
        monitors = watches.monitors
        try:
            timeout = 100                   # ms; sooner when a tick wants to look again
            while not self._stopping:
                for sock, events in self._poller.poll(timeout):
                    if isinstance(sock, zmq.Socket) and sock.closed:
                        continue                    # an earlier handler of this pass closed it (_unwatch)
                    if sock == self._handoff.wake_r:
                        self._handoff.woken()
                    elif not isinstance(sock, zmq.Socket):
                        if self._streams is not None:   # a stream's descriptor or the listener's
                            self._streams.on_event(sock, events)
                    elif sock in monitors:
                        watches.on_monitor(sock)
                    else:
                        self._receive(sock)
                self._drain_queue()
                timeout = 100
                for tick in self._ticks:
                    try:
                        again = tick()
                    except Exception:  # noqa: BLE001
                        logger.exception("error in a tick of the I/O thread")
                        continue
                    if again is not None:
                        timeout = min(timeout, math.ceil(max(TICK_SOONEST, again) * 1000))
            if self._linger > 0:
                self._drain_queue()
        except Exception:  # noqa: BLE001 - the loop must report, never die silently
            logger.exception("ps van I/O thread crashed")
        finally:
            self._close_sockets()
            self._run_leftovers()

    def _run_leftovers(self) -> None:
        """Callables queued while the van stopped still run (they find it stopped and fail
        their request, e.g. a pushpull that MXNet's engine waits on); messages are dropped."""
        for item in self._handoff.close():
            if not isinstance(item, Message):
                try:
                    item()
                except Exception:  # noqa: BLE001
                    logger.debug("callable queued on a stopped van failed", exc_info=True)

    def _drain_queue(self) -> None:
        queue, lock = self._handoff.items, self._send_lock
        while queue:
            try:
                with lock:          # taken off and sent as one step (send_now)
                    item = queue.popleft()
                    if isinstance(item, Message):
                        self._send_locked(item)
                        continue
                item()
            except Exception:  # noqa: BLE001
                logger.exception("error while sending from the I/O thread")

    def _receive(self, sock: zmq.Socket) -> None:
        is_router = sock is self._router
        for i in range(RECV_BATCH):
            # the poll said one message is here; after it, ask before taking another: zmq.Again
            # costs pyzmq an exception object (4 us against 1.5, on every wake-up)
            if i and not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            route = frames[0].bytes if is_router else None
            self._traffic.received(sum(len(f) for f in frames) - (len(frames[0]) if is_router else 0))
            msg = self._decoded(frames[1:] if is_router else frames, route)
            if msg is None:
                continue
            if not is_router:
                msg.source = self._dealers.source(sock)
            self._buffers.note(route if is_router else msg.source, frames[-1])
            self._deliver(msg)

    def _decoded(self, frames: list[Any], route: bytes | None) -> Message | None:
        try:
            return decode(frames, route)
        except NativeNodeError as exc:
            if self.on_native_node is not None:
                self.on_native_node(exc)
            else:
                logger.error("%s: %s", self.address, exc)
        except ProtocolError as exc:
            logger.warning("%s: dropped a malformed message: %s", self.address, exc)
        return None

    def _deliver(self, msg: Message) -> None:
        if self._drop is not None and self._drop(msg):
            return
        if self._verbose >= 2:
            logger.debug("received %r", msg)
        try:
            self._on_message(msg)
        except Exception:  # noqa: BLE001 - one bad message must not kill the node
            logger.exception("error handling %r", msg)

    # -- shutdown ------------------------------------------------------------------------
    def stop(self, linger: float = 0.0, timeout: float = 5.0) -> None:
        if self._thread is None or self._stopping:
            return
        self._linger = linger
        self._stopping = True
        self._handoff.stop()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout + linger)
            if self._thread.is_alive():
                logger.warning("van I/O thread did not stop within %.1fs", timeout + linger)
                return
            self._handoff.close_pipe()             # no thread can write to it any more

    def _close_sockets(self) -> None:
        linger_ms = int(self._linger * 1000)
        self._watches.close()
        if self._router is not None:
            self._router.close(linger=linger_ms)
        self._dealers.close_all(linger_ms)
        if self._streams is not None:
            self._streams.close(self._linger)
        if self._in_process:
            in_process.unregister([self.address, self.local_address])
        elif self._ctx is not None:
            self._ctx.term()
        if self._ipc_path:
            try:
                os.unlink(self._ipc_path)
            except OSError:
                pass


def _peer(msg: Message) -> Any:
    """Where an outgoing message goes: a ROUTER identity, else a node id."""
    return msg.route if msg.route is not None else msg.recver


def _dropped(msg: Message) -> None:
    """Whoever waits for ZeroMQ to let go of the message's arrays need not wait."""
    if msg.on_sent is not None:
        msg.on_sent(None)
