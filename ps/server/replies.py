"""How a server's replies leave (:class:`ReplySender`), and where the server hands them (:class:`Outbox`).

Replies go back on the connection the worker's requests came in on, packed per worker into
messages of about PS_CHUNK_BYTES. A worker across a network that asks for it (Flag.WINDOWED,
PS_SEND_WINDOW) gets its replies most urgent first through a bounded window: the server's
link also carries its host's worker's pushes. Values a reply reads are lent until the
transport lets go of them (ps/server/bufguard.py).

The server hands its replies to an :class:`Outbox`: this sender itself, or, when a backup
keeps this server's replica, ps/server/replication.py, which holds them until the backup
has every change they depend on and then hands them here.
"""
from __future__ import annotations

import time
from typing import Protocol

from ..drain import DrainClock
from ..frames import Batch
from ..message import Command, Flag, Message
from ..postoffice import Postoffice
from ..sendqueue import SendQueue
from .bufguard import BufferGuard
from .profiler import ServerProfiler
from .rounds import Reply


class Outbox(Protocol):
    """What the server hands its replies to (on the I/O thread)."""

    def send(self, replies: list[Reply]) -> None:
        """A handler's data replies, in order; called after every request, with [] too (its
        changes still go to the backup)."""

    def send_message(self, msg: Message) -> None:
        """Any other answer (a server command's)."""


class ReplySender:
    """The Outbox that sends at once (handlers run on the van's I/O thread, so replies leave
    without a thread hop)."""

    def __init__(self, po: Postoffice, guard: BufferGuard):
        self.po, self.guard = po, guard
        self.routes: dict[int, bytes | None] = {}     # worker -> the connection its requests came in on
        self.profiler: ServerProfiler | None = None    # the server's, once made: spans of sending
        # PS_SEND_WINDOW: a key's priority is its latest request's
        window = po.config.send_window
        self._chunk = po.config.chunk_bytes  # PS_CHUNK_BYTES: a message's payload, about
        self._queue = SendQueue(window, po.config.send_lowat, chunk_bytes=self._chunk) if window else None
        self._priority: dict[int, int] = {}
        self._windowed: set[int] = set()     # workers whose requests ask for credits: reached over a network
        self._batches = 0                    # replies made together queue as one group
        self.drain = DrainClock()            # when the tick looks again at full sockets
        if self._queue is not None and po.config.send_lowat:
            po.add_tick(self._tick)
        po.on(Command.CREDIT, self._on_credit)

    def came(self, msg: Message) -> None:
        """A request: its replies go back where it came from, windowed if it asks, at its
        entries' priorities."""
        self.routes[msg.sender] = msg.route
        if self._queue is not None:
            if msg.flags & Flag.WINDOWED:   # it is across a network: queue its replies
                self._windowed.add(msg.sender)
            priority = self._priority
            for entry in msg.body:
                priority[entry.key] = entry.priority

    def forget(self, worker: int) -> None:
        """``worker`` died: what was on the way to it will not be credited, and its
        connection's transport state goes."""
        if self._queue is not None:
            self._queue.forget(worker)
            self._windowed.discard(worker)
        route = self.routes.pop(worker, None)
        if route is not None:
            self.po.forget(route)

    def send_message(self, msg: Message) -> None:
        self.po.send(msg)

    def send(self, replies: list[Reply]) -> None:
        """Group replies per worker into messages of about PS_CHUNK_BYTES each."""
        if not replies:
            return
        profiler = self.profiler
        if profiler is not None and not profiler.running:
            profiler = None
        start = time.perf_counter() if profiler is not None else 0.0
        self._send_now(replies)
        if profiler is not None:
            profiler.record("send replies", "reply", start, {"replies": len(replies)})

    def _send_now(self, replies: list[Reply]) -> None:
        if self._windowed:
            priority, direct = self._priority, []
            self._batches += 1
            for reply in replies:
                if reply.dest in self._windowed:
                    self._queue.add(priority.get(reply.entry.key, 0), *reply, self._batches)
                else:
                    direct.append(reply)
            self._send_queued()
            replies = direct
        batches: dict[int, Batch] = {}
        for dest, entry, data in replies:
            batch = batches.get(dest)
            if batch is None:
                batch = batches[dest] = Batch()
            if batch.add(entry, data) >= self._chunk:
                self._emit(dest, batches.pop(dest))
        for dest, batch in batches.items():
            self._emit(dest, batch)
        # replies still waiting in the send queue keep their values lent (a worker on this
        # machine answered directly must not release a remote one's queued reply)
        self.guard.handed_over(self._queue.frames() if self._windowed else ())

    def _emit(self, dest: int, batch: Batch, flags: int = 0) -> None:
        msg = Message(Command.DATA, recver=dest, body=batch.entries, frames=batch.frames, request=False,
                      route=self.routes.get(dest))
        msg.on_sent = self.guard.on_sent(batch.frames)
        msg.flags = flags
        self.po.send(msg)

    # -- the send window ---------------------------------------------------------------------
    def _send_queued(self) -> None:
        """What the window has room for (the caller then hands the values over)."""
        for out in self._queue.take(self._unsent):
            self._emit(out.dest, out.batch, Flag.CREDIT if out.credit else 0)

    def _unsent(self, dest: int) -> int | None:
        """Replies leave on the connection the worker's requests came in on."""
        return self.po.unsent(dest, self.routes.get(dest))

    def _tick(self) -> float | None:
        """On the I/O thread after each pass: replies held back for a full socket leave once
        it drained; when to look again (ps/drain.py), None while nothing is held back."""
        return self.drain.tick(self._queue, self._offer)

    def _offer(self) -> None:
        self._send_queued()
        self.guard.handed_over(self._queue.frames())     # replies still queued keep lending theirs

    def _on_credit(self, msg: Message) -> None:
        if self._queue is not None and isinstance(msg.body, int):
            self._queue.credit(msg.sender, msg.body)
            if len(self._queue):
                self._offer()
