"""PS_RESEND: acknowledge every message, resend until acknowledged, deliver in order once.

Each channel (peer and direction) numbers its messages 1, 2, 3...; the receiver acks
each, delivers them in sequence order and drops anything below the next expected
number. So a push is applied exactly once and a pull never overtakes the push before
it, and the receiver keeps one counter per peer instead of ps-lite's ever-growing set.
A message still unacknowledged after ``give_up`` seconds reports its peer as lost
(``on_peer_lost``) instead of aborting the process after 10 tries as ps-lite does.

A restarted scheduler is a new process whose peers keep their numbers: its van takes the
first number a channel it never heard brings (``adopt_fresh``), so a live node's next
message reaches it and it can ask the node to report (REJOIN, which travels unnumbered:
both sides then start the channel again from 1, ps/schedlink.py).
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Callable

from ..message import Command, Message
from .base import OnMessage, PeerLost, Van

logger = logging.getLogger(__name__)

MAX_BACKOFF = 8      # resend interval grows to at most 8 x PS_RESEND_TIMEOUT
UNNUMBERED = (Command.ACK, Command.REJOIN)


def _channel(msg: Message, outgoing: bool) -> Any:
    """The peer a message goes to / came from: a ROUTER identity, else a node id."""
    if msg.route is not None:
        return msg.route
    return msg.recver if outgoing else msg.source


class ReliableVan(Van):
    def __init__(self, inner: Van, timeout: float, give_up: float,
                 clock: Callable[[], float] = time.monotonic, adopt_fresh: bool = False):
        self.inner = inner
        self.adopt_fresh = adopt_fresh
        self.timeout = timeout
        self.give_up = give_up
        self.clock = clock
        self.on_peer_lost: PeerLost | None = None
        self.stats = {"sent": 0, "resent": 0, "duplicates": 0, "reordered": 0, "lost": 0}
        self._lock = threading.Lock()
        self._next_seq: dict[Any, int] = {}
        self._unacked: dict[tuple[Any, int], list] = {}   # -> [msg, first sent, last sent, tries]
        self._expected: dict[Any, int] = {}
        self._held: dict[Any, dict[int, Message]] = {}
        self._deliver: OnMessage | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:  # type: ignore[override]
        return self.inner.address

    @property
    def identity(self) -> bytes:
        return self.inner.identity

    @property
    def in_io_thread(self) -> bool:
        return self.inner.in_io_thread

    def endpoint(self, host: str, port: int) -> str:
        return self.inner.endpoint(host, port)

    @property
    def local_address(self) -> str | None:  # type: ignore[override]
        return self.inner.local_address

    def start(self, on_message: OnMessage, host: str, port: int = 0,
              port_range: tuple[int, int] | None = None, name: str = "") -> str:
        self._deliver = on_message
        address = self.inner.start(self._on_inner, host, port, port_range, name)
        self._thread = threading.Thread(target=self._resend_loop, daemon=True, name=f"ps-resend[{name}]")
        self._thread.start()
        return address

    @property
    def on_native_node(self):  # type: ignore[override]
        return self.inner.on_native_node

    @on_native_node.setter
    def on_native_node(self, fn) -> None:
        self.inner.on_native_node = fn

    def connect(self, node_id: int, address: str) -> None:
        self.inner.connect(node_id, address)

    def call_soon(self, fn: Callable[[], None]) -> None:
        self.inner.call_soon(fn)

    def call_later(self, fn: Callable[[], None]) -> None:
        self.inner.call_later(fn)

    def watch(self, node_id: int, address: str, on_event: Callable[[int, bool], None]) -> None:
        self.inner.watch(node_id, address, on_event)

    def unwatch(self, node_id: int) -> None:
        self.inner.unwatch(node_id)

    def unsent(self, node_id: int, route: bytes | None = None) -> int | None:
        return self.inner.unsent(node_id, route)

    def add_tick(self, fn: Callable[[], float | None]) -> None:
        self.inner.add_tick(fn)

    # -- sending -------------------------------------------------------------------------
    def send(self, msg: Message) -> None:
        if msg.cmd in UNNUMBERED:
            self.inner.send(msg)
            return
        # own the payload: a resend must carry the bytes of the first send, not whatever
        # the caller's (or the store's) array holds by then. A process without numpy has no
        # arrays to copy: the scheduler (and the launcher it runs in) never imports it
        np = sys.modules.get("numpy")
        if np is not None and msg.frames:
            msg.frames = [np.array(f, copy=True) if isinstance(f, np.ndarray) else f for f in msg.frames]
        peer = _channel(msg, outgoing=True)
        now = self.clock()
        with self._lock:     # seq order = queue order on the channel
            seq = self._next_seq.get(peer, 1)
            self._next_seq[peer] = seq + 1
            msg.seq = seq
            self._unacked[(peer, seq)] = [msg, now, now, 0]
            self.stats["sent"] += 1
            self.inner.send(msg)

    def _resend_loop(self) -> None:
        while not self._stop.wait(self.timeout / 4):
            now = self.clock()
            lost = []
            with self._lock:
                for key, entry in list(self._unacked.items()):
                    msg, first, last, tries = entry
                    if now - first > self.give_up:
                        del self._unacked[key]
                        lost.append((key[0], msg, now - first))
                    elif now - last > self.timeout * min(2 ** tries, MAX_BACKOFF):
                        entry[2], entry[3] = now, tries + 1
                        self.stats["resent"] += 1
                        try:
                            self.inner.send(msg)
                        except Exception:  # noqa: BLE001 - van stopping
                            return
            for peer, msg, waited in lost:
                self.stats["lost"] += 1
                if self.on_peer_lost is not None:
                    self.on_peer_lost(peer, msg, waited)

    # -- receiving (I/O thread) ------------------------------------------------------------
    def _on_inner(self, msg: Message) -> None:
        peer = _channel(msg, outgoing=False)
        if msg.cmd == Command.ACK:
            with self._lock:
                self._unacked.pop((peer, msg.body), None)
            return
        if not msg.seq:                     # unnumbered, or the peer does not run PS_RESEND
            self._deliver(msg)
            return
        self.inner.send(Message(Command.ACK, msg.recver, msg.source if msg.route is None else msg.sender,
                                msg.seq, request=False, route=msg.route))
        expected = self._expected.get(peer, msg.seq if self.adopt_fresh else 1)
        if msg.seq < expected:
            self.stats["duplicates"] += 1
            return
        if msg.seq > expected:
            self.stats["reordered"] += 1
            self._held.setdefault(peer, {})[msg.seq] = msg
            return
        # counted before it is handled: handling it may forget the channel (a restarted
        # scheduler asking a node to report), which must then stay forgotten
        self._expected[peer] = expected + 1
        self._deliver(msg)
        while True:
            expected, held = self._expected.get(peer), self._held.get(peer)
            if expected is None or not held or expected not in held:
                break
            self._expected[peer] = expected + 1
            self._deliver(held.pop(expected))

    def endpoint_used(self, address: str) -> str:
        return self.inner.endpoint_used(address)

    def transport_stats(self) -> dict[str, int]:
        return {**self.inner.transport_stats(), **self.stats}

    def forget(self, peer: Any) -> None:
        with self._lock:
            self._next_seq.pop(peer, None)
            for key in [k for k in self._unacked if k[0] == peer]:
                del self._unacked[key]
            self._expected.pop(peer, None)
            self._held.pop(peer, None)
            # under the lock: every message numbered before this is stale in the inner van
            # too, every one numbered after is not (one numbered 5 of the old count must
            # never reach the restart, which would then drop the new 5 as a duplicate)
            self.inner.forget(peer)

    def disconnect(self, node_id: int) -> None:
        self.inner.disconnect(node_id)

    def pending(self) -> int:
        with self._lock:
            return len(self._unacked)

    def stop(self, linger: float = 0.0, timeout: float = 5.0) -> None:
        end = self.clock() + linger
        while linger and self.pending() and self.clock() < end:
            time.sleep(0.01)               # let the last messages be acknowledged
        self._stop.set()
        self.inner.stop(linger, timeout)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
