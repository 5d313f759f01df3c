"""Deadlines shared by the phases of one wait, so a timeout names what it waited for; and
the pause watch that keeps a check from blaming others for its own process's pause."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from .errors import PSTimeoutError

logger = logging.getLogger(__name__)

# a peer whose connection stays closed this long is dead: long enough for ZeroMQ to reconnect
# after a reset, short against the heartbeat timeout (the scheduler watches every node, and
# every node watches the scheduler)
DISCONNECT_GRACE = 2.0


# seconds between two turns of a wait that watches its own process's pauses (Deadline.paused)
POLL = 0.5


class Deadline:
    """``Deadline(30)``; ``None`` or ``0`` seconds means no bound."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds or None
        self._clock = clock
        self._end = None if self.seconds is None else clock() + self.seconds
        self._pause: PauseWatch | None = None

    def paused(self) -> bool:
        """Call at the start of a wait and at every turn of it (at least every ``POLL`` s):
        whether this process was just found paused (:class:`PauseWatch`), and if so the end
        moves later by the pause: time the process did not run is nobody's delay, so a
        worker stopped in a debugger for longer than PS_REQUEST_TIMEOUT reads the replies
        that came meanwhile instead of failing on them. One watch per deadline, so that the
        waits sharing it (a handle's requests, one after another) notice a pause whichever
        of them was waiting; the first call only starts it."""
        if self._pause is None:
            self._pause = PauseWatch(POLL, clock=self._clock)
            return False
        return self._pause.hold(self)

    def remaining(self, cap: float | None = None) -> float | None:
        """Seconds left (never negative), at most ``cap``; None when unbounded and no cap."""
        if self._end is None:
            return cap
        left = max(0.0, self._end - self._clock())
        return left if cap is None else min(left, cap)

    @property
    def expired(self) -> bool:
        return self._end is not None and self._clock() >= self._end

    def postpone(self, seconds: float) -> None:
        """Move the end ``seconds`` later (a pause of this process: :meth:`PauseWatch.hold`)."""
        if self._end is not None and seconds > 0:
            self._end += seconds

    def check(self, activity: str) -> None:
        if self.expired:
            raise PSTimeoutError(f"timed out after {self.seconds:g}s waiting for {activity}")


class PauseWatch:
    """Whether a periodic check should hold its judgement this time.

    A check that judges peers by how long it has not heard from them (heartbeats, a sync
    round, a barrier, a reply) must not judge right after its own process did not run: a
    SIGSTOP, a debugger, swap, a paused VM, a starved CPU. What the peers sent meanwhile is
    still unread in its sockets, and it would blame them for its own pause (a server thawed
    after 7 s named the worker whose push was waiting in its socket). A call that comes
    ``slack`` seconds later than ``period`` after the one before holds, and so does every
    call for ``settle`` seconds after it, while the I/O thread reads what waited. Of two
    late calls in a row the second holds only if it is later than the first by more than
    ``slack``, so a check that is always late still judges, and a process stopped right
    after a starved moment still has its pause discounted (else, on a loaded machine, a
    worker stopped in a debugger failed on the reply that waited in its socket).
    ``name()``, if given, names the process in the warning a pause is logged with. A
    deadline handed to :meth:`hold` is postponed by each pause it notices (``Deadline.paused``).
    """

    _logged_at = float("-inf")      # the process's threads notice one pause together
    _log_lock = threading.Lock()

    def __init__(self, period: float, name: Callable[[], str] | None = None, slack: float = 1.0,
                 settle: float = 0.3, clock: Callable[[], float] = time.monotonic):
        self.period, self.name, self.slack, self.settle = period, name, slack, settle
        self._clock = clock
        self._last = clock()                    # the first period starts now
        self._held_until = float("-inf")
        self._held_late = float("-inf")         # how late the call that held last was (-inf: the last did not)

    def hold(self, deadline: Deadline | None = None) -> bool:
        now = self._clock()
        last, self._last = self._last, now
        if now < self._held_until:
            return True
        late = now - last - self.period
        if late > self.slack and late > self._held_late + self.slack:
            self._held_late, self._held_until = late, now + self.settle
            if deadline is not None:
                deadline.postpone(late)
            if self.name and self._first_to_tell(now):
                logger.warning("%s: its periodic checks ran %.1fs late (this process was stopped, swapping or "
                               "starved of CPU): it reads what waited before it names anyone", self.name(), late)
            return True
        self._held_late = float("-inf")
        return False

    def _first_to_tell(self, now: float) -> bool:
        """One line per pause per process: its threads wake from it together."""
        with PauseWatch._log_lock:
            if 0 <= now - PauseWatch._logged_at <= self.slack:
                return False
            PauseWatch._logged_at = now
            return True
