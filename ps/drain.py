"""When to look again at connections held back for a full socket (PS_SEND_LOWAT).

A connection whose kernel buffer holds more than PS_SEND_LOWAT unsent gets nothing more until
it drains, and nothing tells the I/O thread when that is: libzmq owns the socket, and setting
TCP_NOTSENT_LOWAT on it would make the kernel refuse libzmq's writes beyond it, so the backlog
would pile up in libzmq's FIFO instead of ps's priority queue. Looking every millisecond costs a
wake-up of the I/O thread per millisecond for as long as a link is the bottleneck: after a 1 MiB
message on a 100 Mbit/s link, 80 of them. So each look measures how fast each held-back
connection drained since the last one and comes back when half of what still stands between it
and the low-water mark should be gone: a link that speeds up is still met with the low-water
mark's bytes queued in the kernel, and a long drain takes a handful of looks, not one per
millisecond.
"""
from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

from .van.base import TICK_SOONEST

SOONEST = TICK_SOONEST  # s: the I/O loop's finest period
LATEST = 0.020          # s: the longest a drain estimate may defer a look
STALLED = 0.002         # s: the next look at a connection that did not drain since the last one
SHARE = 0.5             # come back when this share of the excess should have drained
EARLY = SOONEST / 2     # s: a look this close to its plan counts as due (the loop's timer is in ms)


class _Look(NamedTuple):
    at: float           # time.monotonic()
    excess: int         # bytes the connection had to send before it takes more
    taken: int          # the queue's count of entries taken for it then (Held.taken)
    wait: float         # the wait this look chose for the connection


class DrainClock:
    """Per connection (a peer id), its last look; not thread-safe (its owner's lock, or the
    I/O thread's alone). ``held`` maps each held-back connection to a ``sendqueue.Held``:
    the bytes it must send before it has room, and how many entries were ever taken for it.
    A connection that was given more since its last look had room in between: its old
    reading measures nothing, and it starts afresh. ``clock``: time.monotonic, or a test's."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last: dict[int, _Look] = {}

    def tick(self, queue: Any, offer: Callable[[], None]) -> float | None:
        """A send window's tick (``queue``: a ``sendqueue.SendQueue``): when a look is due,
        ``offer()`` what the queue now has room for; the seconds until the next look, None
        while the queue holds nothing back for want of room."""
        if not queue.blocked:
            return None
        wait = self.due_in(queue.held_back)
        if wait > 0:
            return wait
        offer()
        return self.next_look(queue.held_back) if queue.blocked else None

    def due_in(self, held: dict[int, Any]) -> float:
        """Seconds until the planned look (0: now). The loop runs its ticks after every
        message as well; a look before it is due would read the same sockets for nothing
        (what a credit or a new request frees is offered where it arrives). A connection held
        back anew, or given more, since the last look is due at once; one within EARLY of
        its plan too."""
        now, soonest = self.clock(), LATEST
        for peer, h in held.items():
            look = self._last.get(peer)
            if look is None or look.taken != h.taken:
                return 0.0
            soonest = min(soonest, look.wait - (now - look.at))
        return soonest if soonest >= EARLY else 0.0

    def next_look(self, held: dict[int, Any]) -> float:
        """Seconds until the next look, given each held-back connection now. Connections not
        in ``held`` are forgotten. One whose own look is not due yet (another's is) keeps its
        plan: a reading over a fraction of a millisecond, with the kernel sending in bursts,
        would give a rate far off."""
        now = self.clock()
        last, self._last = self._last, {}
        soonest = LATEST
        for peer, h in held.items():
            left = h.excess
            before = last.get(peer)
            if before is None or before.taken != h.taken:
                look = _Look(now, left, h.taken, SOONEST)       # no rate yet: the next look measures one
            elif now - before.at < before.wait - EARLY:
                look = before
            elif before.excess > left:
                rate = (before.excess - left) / (now - before.at)
                look = _Look(now, left, h.taken, min(max(SHARE * left / rate, SOONEST), LATEST))
            else:                                               # no progress seen: look again soon
                look = _Look(now, left, h.taken, STALLED)
            self._last[peer] = look
            soonest = min(soonest, max(look.wait - (now - look.at), 0.0))
        return soonest
