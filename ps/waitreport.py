"""A worker's side of PS_DEADLOCK_CHECK (ps/waits.py): tell the scheduler what this worker
has waited for too long, and raise MismatchError on every wait when the scheduler finds
the workers' waits deadlocked.

Nothing happens on a wait that ends within PS_DEADLOCK_CHECK seconds: the waits call
:meth:`WaitReporter.waiting` only at their poll turns after that, so a job that never
stalls sends nothing. A blocked spell is reported every PS_DEADLOCK_CHECK seconds (the
scheduler decides only on two reports of one version: a worker that pushed nothing
meanwhile), and its end once, so the scheduler forgets it.

The verdict comes after the servers dropped every open round (the rounds the disagreement
left half pushed, which would otherwise mix into the next call of their keys): this worker
fails every request still outstanding with the verdict's MismatchError, numbers its next
push of each dropped key after the rounds that did close, and tells its listeners (the
collective layer forgets which names it has checked, so every worker checks them again).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from ._timing import POLL
from .customer import Request
from .errors import MismatchError
from .message import SCHEDULER, Command, Message
from .waits import BARRIER, RESET, Awaited, Report

logger = logging.getLogger(__name__)
REALIGN_WAIT = 60.0     # s a worker that raised a check's MismatchError waits for the others to raise it


class WaitReporter:
    """Owned by a KVStore that checks for deadlocks (``KVStore.check_deadlocks``)."""

    def __init__(self, po: Any, worker: Any, after: float, describe: Callable[[int, str], str],
                 members: Callable[[int], tuple[int, ...]]):
        self.po, self.worker, self.after = po, worker, after
        self.describe = describe            # (server key, the request's own text) -> how the script knows it
        self.members = members              # server key -> the only ranks that push it (empty: every worker)
        self.listeners: list[Callable[[MismatchError], None]] = []
        self._lock = threading.Lock()
        self._blocked: dict[int, Awaited] = {}      # id of a waiting request (or barrier) -> what it waits for
        self._episode = 0
        self._reported_at = 0.0
        self._reported = False
        self._resets = 0                    # realignments this worker asked for (RESET's "pushes")
        self._realigned = threading.Event()
        self._reset_error: MismatchError | None = None
        po.on(Command.BLOCKED, self._on_verdict)

    @classmethod
    def watching(cls, po: Any, worker: Any, after: float, infos: Callable[[], Any], describe: Callable[[Any], str],
                 members: Callable[[int], tuple[int, ...]]) -> "WaitReporter":
        """A reporter that ``worker``'s requests and ``po``'s barriers report to from now on.
        ``infos()``: the store's keys (KeyInfo: server key, name), ``describe(name)``: how an
        error names a key."""
        by_key: dict[int, Any] = {}

        def what(key: int, text: str) -> str:
            if key not in by_key:
                by_key.update((info.key, info.name) for info in infos())
            name = by_key.get(key)
            return text if name is None else describe(name)
        reporter = cls(po, worker, after, what, members)
        worker.watch_waits(reporter)
        po.waits = reporter
        return reporter

    # -- called by the waits (any thread) ----------------------------------------------------
    def waiting(self, req: Request, waited: float) -> None:
        """A request still unanswered after ``waited`` seconds (at a poll turn of its wait)."""
        if waited < self.after or req.key is None:
            return
        self._add(id(req), Awaited(req.key, req.seq, self.describe(req.key, req.what), self.members(req.key)))

    def barrier(self, entered: int, waited: float) -> None:
        """A barrier of every worker, this worker's ``entered``-th, still closed after ``waited`` s."""
        if waited >= self.after:
            self._add(BARRIER, Awaited(BARRIER, entered, "a barrier of every worker (hvd.barrier)"))

    def realign(self, error: MismatchError, members: tuple[int, ...] | None = None) -> MismatchError:
        """A check found the workers disagreeing (every worker, or every one of ``members``,
        the ranks of a process set, raises ``error``'s kind at the same call): wait until each
        got here, while the servers drop the rounds the disagreement left open (of the set's
        keys alone), so that none of them mixes into a later call. Returns
        ``error`` to raise. A worker that does not come here is no reason to wait for good:
        this wait is reported like any other (a verdict ends it), and it gives up after
        ``REALIGN_WAIT`` seconds, saying so."""
        if getattr(error, "realigned", False):
            return error
        error.realigned = True
        with self._lock:
            self._resets += 1
            number = self._resets
            done = self._realigned = threading.Event()
            self._reset_error = error
        self._send({"rank": self.po.rank, "reset": number, "members": None if members is None else list(members)})
        since = time.monotonic()
        try:
            while not done.wait(POLL):
                waited = time.monotonic() - since
                if self.po.failure is not None:
                    raise self.po.failure
                if waited > REALIGN_WAIT:
                    logger.warning("worker %d: the other workers did not raise the same MismatchError within %gs; "
                                   "rounds the disagreement left open may still be open", self.po.rank, REALIGN_WAIT)
                    break
                if waited >= self.after:
                    self._add(RESET, Awaited(RESET, number, "the others to raise the same MismatchError",
                                             tuple(members or ())))
        finally:
            self.ended(RESET)
        return error

    def ended(self, req_or_barrier: Any) -> None:
        """A wait that may have been reported is over (answered, failed or given up)."""
        key = req_or_barrier if req_or_barrier in (BARRIER, RESET) else id(req_or_barrier)
        with self._lock:
            if self._blocked.pop(key, None) is None or self._blocked:
                return
            reported, self._reported = self._reported, False
            episode = self._episode
        if reported:
            self._send({"rank": self.po.rank, "episode": episode, "over": True})

    def _add(self, key: int, wait: Awaited) -> None:
        now = time.monotonic()
        if now - self._reported_at < self.after and key in self._blocked:
            return                  # the usual poll turn: reported lately, nothing new
        with self._lock:
            if not self._blocked:
                self._episode += 1
                self._reported_at = 0.0
            self._blocked[key] = wait
            if now - self._reported_at < self.after:
                return
            self._reported_at, self._reported = now, True
            waits = tuple(self._blocked.values())
            episode = self._episode
        pushes, version = self.worker.push_counts()
        entered = self.po.barriers.passed.get("workers", 0) + (1 if any(w.key == BARRIER for w in waits) else 0)
        pushes[BARRIER] = entered
        pushes[RESET] = self._resets
        self._send(Report(self.po.rank, episode, version + entered, waits, pushes).to_body())

    def _send(self, body: dict[str, Any]) -> None:
        try:
            self.po.send(Message(Command.BLOCKED, recver=SCHEDULER, body=body))
        except Exception as exc:    # noqa: BLE001 - a report is advice: the wait goes on without it
            logger.debug("deadlock report not sent: %s", exc)

    # -- the verdict (I/O thread) ------------------------------------------------------------
    def _on_verdict(self, msg: Message) -> None:
        body = msg.body
        if not isinstance(body, dict) or "verdict" not in body:
            return
        if body["verdict"] is None:         # every worker realigned after a check's MismatchError
            error = self._reset_error or MismatchError("the workers disagreed")
        else:
            error = MismatchError(str(body["verdict"]))
            error.realigned = True
            logger.info("worker %d: %s", self.po.rank, error)
        self.worker.restart_rounds({int(k): int(n) for k, n in body.get("closed", [])})
        self.worker.fail_pending(error)
        self.po.break_barrier("workers", error)
        with self._lock:
            self._blocked.clear()
            self._reported = False
            self._realigned.set()
        for listener in self.listeners:
            listener(error)
