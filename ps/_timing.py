"""Deadlines shared by the phases of one wait, so a timeout names what it waited for."""
from __future__ import annotations

import time
from typing import Callable

from .errors import PSTimeoutError

# a peer whose connection stays closed this long is dead: long enough for ZeroMQ to reconnect
# after a reset, short against the heartbeat timeout (the scheduler watches every node, and
# every node watches the scheduler)
DISCONNECT_GRACE = 2.0


class Deadline:
    """``Deadline(30)``; ``None`` or ``0`` seconds means no bound."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds or None
        self._clock = clock
        self._end = None if self.seconds is None else clock() + self.seconds

    def remaining(self, cap: float | None = None) -> float | None:
        """Seconds left (never negative), at most ``cap``; None when unbounded and no cap."""
        if self._end is None:
            return cap
        left = max(0.0, self._end - self._clock())
        return left if cap is None else min(left, cap)

    @property
    def expired(self) -> bool:
        return self._end is not None and self._clock() >= self._end

    def check(self, activity: str) -> None:
        if self.expired:
            raise PSTimeoutError(f"timed out after {self.seconds:g}s waiting for {activity}")
