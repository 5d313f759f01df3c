"""PS_SEND_WINDOW: requests (and replies) leave most urgent first, with few bytes on the way.

MXNet gives each layer's push ``priority=-index``: the first layer's weights are the first
the next forward pass needs, but its gradient is the last one backward produces. Sent in
call order, it queues behind every other layer's bytes, and once bytes sit in socket
buffers and the link's queue nothing can overtake them. So requests wait here, cut in the
~1 MiB chunks they travel in, ordered by priority; only ``window`` bytes may be between
this worker and its servers. A server credits each message as it arrives
(``Command.CREDIT``), and the chunk that goes next is picked then, from whatever is most
urgent by that time.

A request never overtakes an earlier one to the same key (a pull must see the push
before it): it takes the lower of its priority and that of the key's queued entries.
A server queues its replies the same way (``server`` is then the worker they go to): its
link also carries its host's worker's pushes.

PS_SEND_LOWAT: the window alone leaves most of its bytes in the kernel's socket buffers
(measured 2-13 MB per host with an 8 MiB window, against under 1 MB in the link's queue),
FIFO, in front of the next urgent message. So a connection also gets nothing more while its
kernel holds more than ``PS_SEND_LOWAT`` bytes unsent (``Van.unsent``); the backlog stays
here, in priority order, and the van's tick offers it again once the connection should have
drained (``held_back`` says which wait; ps/drain.py says when to look).

A message of at most ``CREDIT_MIN`` payload bytes is neither counted in the window nor
credited: its credit would cost a message each way, and the processing of both, for bytes
that hold nothing urgent back for long (PS_SEND_LOWAT still bounds what waits in the
socket). A small model's step across 4 hosts (12 keys, 0.3 MB) took 4 % less time.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

from .frames import Batch
from .keys import CHUNK_BYTES
from .message import Entry

CREDIT_MIN = 64 << 10       # payload bytes above which a message counts in the window and is credited


class Queued(NamedTuple):
    rank: int           # -priority: heapq pops the smallest
    group: int          # among equal priorities, earlier requests (replies) first
    offset: int         # within one, chunk i of every server's (worker's) slice before chunk i + 1
    order: int          # then FIFO
    server: int
    entry: Entry
    data: Any


class Outgoing(NamedTuple):
    """A message :meth:`SendQueue.take` lets leave."""

    dest: int           # the server (worker) it goes to
    batch: Batch
    credit: bool        # counted in the window: the receiver must credit it (Flag.CREDIT)


class Held(NamedTuple):
    """A connection a take held back for want of room (PS_SEND_LOWAT)."""

    excess: int         # bytes it must send before it has room
    taken: int          # entries ever taken for it: a change says it had room in between


class SendQueue:
    """Not thread-safe: the worker calls it under its lock.

    One heap per server: the next entry is the most urgent head among the servers whose
    connection has room (PS_SEND_LOWAT), so a backed-up connection holds back only its own."""

    def __init__(self, window: int, lowat: int = 0, credit_min: int = CREDIT_MIN, chunk_bytes: int = CHUNK_BYTES):
        self.window = window
        self.chunk_bytes = chunk_bytes              # PS_CHUNK_BYTES: a message's payload, about
        self.lowat = lowat                          # PS_SEND_LOWAT; 0: only the window bounds a take
        self.credit_min = credit_min
        self.in_flight = 0                          # payload bytes sent and not yet credited
        self.held_back: dict[int, Held] = {}        # the servers the last take() held back for want of room
        self._taken: dict[int, int] = {}            # server id -> entries taken for it, ever
        self._by_server: dict[int, int] = {}        # server id -> its share of in_flight
        self._heaps: dict[int, list[Queued]] = {}   # server id -> its queued entries
        self._order = itertools.count()
        self._key_rank: dict[int, list[int]] = {}   # key -> [rank of its least urgent queued entry, entries queued]

    @property
    def blocked(self) -> bool:
        """The last take() held entries back for want of room (PS_SEND_LOWAT)."""
        return bool(self.held_back)

    def __len__(self) -> int:
        return sum(len(h) for h in self._heaps.values())

    def add(self, priority: int, server: int, entry: Entry, data: Any, group: int = 0) -> None:
        """``group``: the request's timestamp on a worker, the batch of replies on a server.
        A key's slices go to all its servers at once, chunk by chunk: sent slice after slice,
        every worker would push to one server at a time (the same one), and that server's
        link would carry what all the others' links could share."""
        rank = -priority
        held = self._key_rank.get(entry.key)
        if held is None:
            self._key_rank[entry.key] = [rank, 1]
        else:
            rank = held[0] = max(rank, held[0])
            held[1] += 1
        heap = self._heaps.get(server)
        if heap is None:
            heap = self._heaps[server] = []
        heapq.heappush(heap, Queued(rank, group, entry.offset, next(self._order), server, entry, data))

    def take(self, unsent: Callable[[int], int | None] | None = None) -> list[Outgoing]:
        """The messages that may leave now: the most urgent entries while the window has
        room, packed per server into messages of about ``chunk_bytes``; those of at most
        ``credit_min`` bytes leave uncounted.

        A pass counts each box while it fills, and the small ones leave uncounted after all:
        a window smaller than the servers' small boxes together ends a pass with room again
        and entries left, which no credit and no tick would ever offer again. So passes
        repeat while they send something and the window has room."""
        sent: list[Outgoing] = []
        rooms: dict[int, int | None] = {}       # what each connection may still take in this take()
        self.held_back = {}
        while True:
            more = self._take_pass(unsent, rooms)
            sent.extend(more)
            if not more or not self._heaps or self.in_flight >= self.window:
                return sent

    def _take_pass(self, unsent: Callable[[int], int | None] | None,
                   rooms: dict[int, int | None]) -> list[Outgoing]:
        """One pass of :meth:`take`.

        ``unsent(server)``: bytes the kernel holds unsent on the connection to ``server``
        (``Van.unsent``), None if unknown. With ``lowat`` set, a server whose connection
        holds ``lowat`` or more keeps its entries for a later take (``blocked`` says so);
        the other servers' go past them. One message may overshoot, as a write may
        overshoot TCP_NOTSENT_LOWAT."""
        out: list[tuple[int, Batch]] = []
        if self.in_flight >= self.window or not self._heaps:
            return []
        heads: list[Queued] = []
        for server, heap in self._heaps.items():
            left = rooms[server] = rooms[server] if server in rooms else self._room(server, unsent)
            if left is None or left > 0:
                heads.append(heap[0])
            else:
                self.held_back[server] = Held(1 - left, self._taken.get(server, 0))
        heapq.heapify(heads)
        boxes: dict[int, Batch] = {}
        while heads and self.in_flight < self.window:
            server = heads[0].server
            heap = self._heaps[server]
            item = heapq.heappop(heap)
            self._release(item.entry.key)
            box = boxes.get(server)
            if box is None:
                box = boxes[server] = Batch()
            before = box.nbytes
            if box.add(item.entry, item.data) >= self.chunk_bytes:
                out.append((server, boxes.pop(server)))
            added = box.nbytes - before
            self._count(server, added)
            if self.lowat:
                self._taken[server] = self._taken.get(server, 0) + 1
            left = rooms[server]
            if left is not None:
                left = rooms[server] = left - added
            if not heap:
                del self._heaps[server]
                heapq.heappop(heads)
            elif left is not None and left <= 0:
                self.held_back[server] = Held(1 - left, self._taken.get(server, 0))
                heapq.heappop(heads)
            else:
                heapq.heapreplace(heads, heap[0])
        out.extend(boxes.items())
        # every box was counted while it filled (the window bounds this loop, and a box's size is
        # known only once it is closed); the ones that stayed small leave uncounted after all
        sent = []
        for server, box in out:
            credit = box.nbytes > self.credit_min
            if not credit:
                self._count(server, -box.nbytes)
            sent.append(Outgoing(server, box, credit))
        return sent

    def _room(self, server: int, unsent: Callable[[int], int | None] | None) -> int | None:
        """Payload bytes the connection to ``server`` may take now; None: no limit."""
        if not self.lowat or unsent is None:
            return None
        held = unsent(server)
        return None if held is None else self.lowat - held

    def frames(self) -> list[Any]:
        """The arrays queued entries will send (their memory must not change meanwhile)."""
        return [q.data for heap in self._heaps.values() for q in heap if q.data is not None]

    def credit(self, server: int, nbytes: int) -> None:
        """``server`` received a message of ``nbytes`` payload bytes."""
        have = self._by_server.get(server, 0)
        nbytes = min(nbytes, have)              # a late credit from a server's dead incarnation
        self._by_server[server] = have - nbytes
        self.in_flight -= nbytes

    def forget(self, server: int) -> None:
        """``server`` died: what was on the way to it will never be credited, and what
        waits for it is dropped (a worker resends its requests to the restart itself)."""
        self.in_flight -= self._by_server.pop(server, 0)
        for q in self._heaps.pop(server, ()):
            self._release(q.entry.key)

    def _release(self, key: int) -> None:
        """One of ``key``'s queued entries left the queue."""
        held = self._key_rank[key]
        held[1] -= 1
        if not held[1]:
            del self._key_rank[key]

    def _count(self, server: int, nbytes: int) -> None:
        self._by_server[server] = self._by_server.get(server, 0) + nbytes
        self.in_flight += nbytes
