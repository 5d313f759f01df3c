"""A node's side of the job's barriers: the waits open at the scheduler's barriers, and how
many of each group's barriers this node has passed (the count a restarted scheduler is told,
ps/rejoin.py, and that lets a restarted node's barriers its dead self passed be answered at
once). The scheduler's side, the counting, is ps/barriers.py."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ._timing import POLL, Deadline
from .errors import PeerLostError, PSError
from .waits import BARRIER


class BarrierWaits:
    def __init__(self) -> None:
        self._open: dict[str, tuple[threading.Event, list]] = {}    # group -> (answered, [its error or None])
        self.passed: dict[str, int] = {}    # group -> barriers this node passed

    @property
    def groups(self) -> list[str]:
        """The groups whose barrier this node waits at now."""
        return sorted(self._open)

    def wait(self, group: str, ask: Callable[[], None], deadline: Deadline, failure: Callable[[], PSError | None],
             what: str | None, waits: Any = None) -> None:
        """``ask`` the scheduler, then block until it answers, ``failure()`` is set or the deadline
        passes (PSTimeoutError naming ``what``). ``waits``: PS_DEADLOCK_CHECK's reporter, told of
        a long wait."""
        event, result = threading.Event(), []
        self._open[group] = (event, result)
        deadline.paused()                   # this process's own pause is no one's delay
        since = time.monotonic()
        try:
            ask()
            while not event.wait(deadline.remaining(POLL)):
                deadline.paused()
                if failure() is not None:
                    raise failure()
                deadline.check(what or f"a barrier of all {group} (group '{group}')")
                if waits is not None:
                    waits.barrier(self.passed.get(group, 0) + 1, time.monotonic() - since)
        finally:
            self._open.pop(group, None)
            if waits is not None and time.monotonic() - since >= waits.after:
                waits.ended(BARRIER)
        if failure() is not None:
            raise failure()
        if result and isinstance(result[0], PSError):
            raise result[0]
        if result and result[0]:
            raise PeerLostError(result[0])
        self.passed[group] = self.passed.get(group, 0) + 1

    def answer(self, group: str, error: str | PSError | None = None) -> None:
        """The scheduler's answer (``error``: why the barrier cannot complete), or a deadlock
        verdict's error: the wait at ``group``, if any, ends."""
        entry = self._open.get(group)
        if entry is not None:
            entry[1].append(error)
            entry[0].set()

    def fail_all(self, reason: str) -> None:
        for event, result in self._open.values():
            result.append(reason)
            event.set()
