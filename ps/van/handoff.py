"""What other threads hand a van's I/O thread: messages to send and functions to run, in one
queue, and the pipe whose byte wakes the I/O thread's poll.

A van's sockets belong to its I/O thread; every other thread reaches them through here.
The queue keeps its order (a push's chunks, then the next push), and a wake-up is written
only when none is pending, so a burst of requests costs one.
"""
from __future__ import annotations

import collections
import os
import threading
from typing import Any

from ..errors import TransportError


class Handoff:
    def __init__(self) -> None:
        self.items: collections.deque = collections.deque()
        self._lock = threading.Lock()      # put vs the last look at the queue on stop
        self.accepting = False             # started and not stopping
        self.closed = False                # the loop ended: nothing queued runs any more
        self._wake_pending = False
        self.wake_r, self._wake_w = -1, -1

    def open(self) -> int:
        """Make the wake-up pipe and accept items; its read end, for the I/O thread's poll."""
        self.wake_r, self._wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        self.accepting = True
        return self.wake_r

    def __bool__(self) -> bool:
        return bool(self.items)

    def put(self, item: Any) -> None:
        """From another thread: queue ``item`` and wake the I/O thread."""
        with self._lock:
            if not self.accepting or self.closed:
                raise TransportError("the van is not running")
            self.items.append(item)
        if not self._wake_pending:
            self._wake_pending = True
            self.wake()

    def put_here(self, item: Any) -> None:
        """On the I/O thread: queue ``item`` with no wake-up (the loop drains its queue before
        it polls again, and a stopping loop runs what is left)."""
        with self._lock:
            if self.closed:
                raise TransportError("the van is not running")
            self.items.append(item)

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass

    def woken(self) -> None:
        """On the I/O thread, its poll woken by the pipe: empty it."""
        try:
            while os.read(self.wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        # Reset only after the pipe is empty. Resetting first loses wake-ups: a sender that
        # sees False writes a byte that the read above then swallows, the flag stays True,
        # and from then on every send waits for the 100 ms poll timeout.
        self._wake_pending = False

    def stop(self) -> None:
        """Accept nothing more from other threads; wake the loop to end."""
        self.accepting = False
        self.wake()

    def close(self) -> list[Any]:
        """The loop ended: take what is left; nothing more is accepted."""
        with self._lock:
            self.closed = True
            left, self.items = list(self.items), collections.deque()
        return left

    def close_pipe(self) -> None:
        """Once no thread can write to it any more."""
        for fd in (self.wake_r, self._wake_w):
            os.close(fd)
