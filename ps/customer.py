"""Tracks a worker's outstanding requests and fills pulled values in as replies arrive.

Replies are handled on the van's I/O thread (one copy from the received frame into
the caller's array); the caller's thread only waits on an Event.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any, Callable, NamedTuple

import numpy as np

from ._timing import POLL, Deadline
from .errors import CollectiveError, PeerLostError, PSError, PSTimeoutError, RemoteError
from .message import Message, Op, node_name
from .nodestats import Histogram

logger = logging.getLogger(__name__)
# a server's error kinds raised as ps's own exception classes (the rest: RemoteError)
_LOCAL_ERRORS = {"PeerLostError": PeerLostError, "CollectiveError": CollectiveError}


class StallWatch(NamedTuple):
    """PS_STALL_WARNING on a worker's own waits. The servers and the scheduler name the
    workers a round or a barrier lacks, and tell the workers waiting on it; a wait none of
    them has named by twice the threshold (a reply that does not come although no round
    lacks a push) is named by the waiting worker itself."""
    after: float                        # seconds; 0: never
    noticed: Callable[[], float]        # time.monotonic() of the last STALL this worker was sent
    waits: Any = None                   # PS_DEADLOCK_CHECK's reporter (ps/waitreport.py), if on


NO_WATCH = StallWatch(0.0, lambda: 0.0)


class Request:
    __slots__ = ("ts", "remaining", "out", "starts", "error", "event", "what", "pending", "callbacks", "sent", "got",
                 "left", "since", "warned", "key", "seq", "reader")

    def __init__(self, ts: int, remaining: int, out: np.ndarray | None, starts: dict[int, int], what: str,
                 keep: bool = False):
        self.ts = ts
        self.remaining = remaining          # elements still to receive (pulls) or acks (pushes)
        self.out = out                      # flat view the pulled values go into
        self.starts = starts                # server id -> offset of its slice in ``out``
        self.error: PSError | None = None
        self.event = threading.Event()
        self.what = what
        self.pending = set(starts)          # servers that have not finished answering
        self.left: dict[int, int] = {}      # server -> elements of its slice still to come (pulls)
        self.callbacks: list[Callable[[Request], None]] | None = None
        # PS_MAX_RESTARTS: what went to each server (resent to its restart) and what came back
        self.sent: list[tuple[int, Any, Any]] | None = [] if keep else None
        self.got: dict[int, dict[int, int]] = {}    # server -> {offset: elements} of the chunks it answered
        self.since = time.monotonic()
        self.warned = False
        self.key: int | None = None         # the server key and this worker's push number there
        self.seq = 0                        # (a pull: its last push's), for PS_DEADLOCK_CHECK
        # reads the reply on the waiting thread for up to the seconds given (KVWorker sets
        # it for a lone request to a server on this machine); False: wait on ``event``
        self.reader: Callable[[float], bool] | None = None

    def restart(self, server: int) -> list[tuple[Any, Any]]:
        """``server`` restarted before answering: forget its partial answer; what to resend."""
        self.remaining += sum(self.got.pop(server, {}).values())
        self.left.pop(server, None)
        return [(entry, data) for sid, entry, data in self.sent or () if sid == server]

    def wait(self, deadline: Deadline, failure: Callable[[], PSError | None], watch: StallWatch = NO_WATCH) -> None:
        # the heartbeat thread names a pause; the deadline's watch holds the warning and
        # postpones the deadline (nothing for a request already answered, the usual case)
        if not self.event.is_set():
            deadline.paused()
        try:
            self._wait(deadline, failure, watch)
        finally:
            if watch.waits is not None and time.monotonic() - self.since >= watch.waits.after:
                watch.waits.ended(self)
        if self.error is not None:
            raise self.error

    def _wait(self, deadline: Deadline, failure: Callable[[], PSError | None], watch: StallWatch) -> None:
        while not self._waited(deadline.remaining(POLL)):
            held = deadline.paused()
            exc = failure()
            if exc is not None:
                raise exc
            if deadline.expired:
                raise PSTimeoutError(f"{self.what}: no complete reply from {self._servers()} within "
                                     f"{deadline.seconds:g}s (PS_REQUEST_TIMEOUT)")
            waited = time.monotonic() - self.since
            if watch.after and waited >= 2 * watch.after and not self.warned and not held:
                self.warned = True
                if watch.noticed() < self.since:         # nobody has named this wait
                    logger.warning("%s: no complete reply from %s after %.0fs, and no server has named a worker it "
                                   "waits for: is that server stopped or overloaded? (PS_STALL_WARNING=%gs; request %d, "
                                   "%d elements or acks to come)",
                                   self.what, self._servers(), waited, watch.after, self.ts, self.remaining)
            if watch.waits is not None:
                watch.waits.waiting(self, waited)

    def _waited(self, seconds: float) -> bool:
        reader = self.reader
        if reader is not None and not self.event.is_set():
            if reader(seconds):
                return self.event.is_set()
            self.reader = None
        return self.event.wait(seconds)

    def _servers(self) -> str:
        return ", ".join(node_name(i) for i in sorted(self.pending)) or "-"


class Customer:
    def __init__(self, keep: bool = False) -> None:
        self.keep = keep                        # requests keep what they sent (PS_MAX_RESTARTS)
        self._requests: dict[int, Request] = {}
        self._ts = itertools.count(1)
        self._lock = threading.Lock()
        self.failure: PSError | None = None
        self.latency = Histogram()              # answered requests' round trips (the dashboard)

    def new_request(self, remaining: int, out: np.ndarray | None, starts: dict[int, int],
                    what: str) -> Request:
        req = Request(next(self._ts), remaining, out, starts, what, self.keep)
        with self._lock:
            if self.failure is not None:
                raise self.failure
            self._requests[req.ts] = req
        return req

    def when_done(self, req: Request, fn: Callable[[Request], None]) -> None:
        """Call ``fn(req)`` once ``req`` has finished (now, if it has already)."""
        with self._lock:
            if req.ts in self._requests:
                if req.callbacks is None:
                    req.callbacks = []
                req.callbacks.append(fn)
                return
        fn(req)

    def pending(self) -> list[Request]:
        with self._lock:
            return list(self._requests.values())

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    def answers_alone(self, msg: Message) -> bool:
        """Whether every request ``msg`` answers waits on its sender alone and resends
        nothing (PS_MAX_RESTARTS): then no other thread touches them while this one
        handles ``msg`` (``on_reply`` is otherwise the I/O thread's)."""
        requests = self._requests
        for entry in msg.body:
            req = requests.get(entry.ts)
            if req is not None and (req.sent is not None or len(req.pending) != 1 or msg.sender not in req.pending):
                return False
        return True

    def on_reply(self, msg: Message) -> None:
        arrays = iter(msg.frames)
        requests = self._requests
        for entry in msg.body:
            error = entry.error
            data = next(arrays) if (entry.op & Op.PULL and error is None) else None
            req = requests.get(entry.ts)
            if req is None or msg.sender not in req.pending:
                continue                      # late reply to a request that already failed, or a repeat
            if error is not None:
                kind, text = error
                text = f"{req.what}: {text}"     # the server knows str keys only by their hash
                exc_type = _LOCAL_ERRORS.get(kind)
                req.error = exc_type(text) if exc_type else RemoteError(text, kind, node_name(msg.sender))
                self._finish(req)
                continue
            if data is not None:
                n = entry.length
                if req.sent is not None:
                    # a restarted server can get a request twice (the resend, and the copy
                    # queued when it came back): one answer per chunk counts
                    got = req.got.setdefault(msg.sender, {})
                    if entry.offset in got:
                        continue
                    got[entry.offset] = n
                start = req.starts[msg.sender] + entry.offset
                req.out[start:start + n] = data
                req.remaining -= n
                # counted, not read off the last offset: whatever order a server sends a
                # slice's chunks in (it answers a pushpull's chunks as each is summed)
                left = req.left[msg.sender] = req.left.get(msg.sender, entry.total) - n
                if left <= 0:
                    req.pending.discard(msg.sender)
            else:
                req.remaining -= 1
                req.pending.discard(msg.sender)
            if req.remaining <= 0:
                self._finish(req)

    def _finish(self, req: Request) -> None:
        with self._lock:
            self._requests.pop(req.ts, None)
            callbacks, req.callbacks = req.callbacks, None
        if req.error is None:
            self.latency.observe(time.monotonic() - req.since)
        req.event.set()
        _run_callbacks(req, callbacks)

    def fail(self, req: Request, exc: PSError) -> None:
        """End ``req`` here with ``exc``: its answer can never come (the workers disagreed on
        its key, so its round never closes), and nobody, ``close()`` included, should wait for
        it. A reply that still arrives is dropped as a late one."""
        with self._lock:
            if self._requests.pop(req.ts, None) is None:
                return                        # finished already
            callbacks, req.callbacks = req.callbacks, None
        req.error = exc
        req.event.set()
        _run_callbacks(req, callbacks)

    def fail_pending(self, exc: PSError) -> None:
        """End every request outstanding now with ``exc``; later ones go out as usual (a
        deadlock verdict: the rounds they waited on were dropped)."""
        for req in self.pending():
            self.fail(req, exc)

    def fail_all(self, exc: PSError) -> None:
        with self._lock:
            self.failure = exc
            requests, self._requests = list(self._requests.values()), {}
            callbacks = [(req, req.callbacks) for req in requests]
            for req in requests:
                req.callbacks = None
        for req in requests:
            req.error = exc
            req.event.set()
        for req, fns in callbacks:
            _run_callbacks(req, fns)


def _run_callbacks(req: Request, callbacks: list[Callable[[Request], None]] | None) -> None:
    for fn in callbacks or ():
        try:
            fn(req)
        except Exception:           # on the I/O thread: log, never stop it
            logger.exception("callback of %s failed", req.what)


class _Countdown:
    """Calls ``fn`` once ``tick`` was called ``n`` times, from whichever threads."""

    __slots__ = ("left", "fn", "lock")

    def __init__(self, n: int, fn: Callable[[], None]):
        self.left, self.fn, self.lock = n, fn, threading.Lock()

    def tick(self, _req: Request) -> None:
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self.fn()


class Handle:
    """The future of a non-blocking call: ``wait()`` returns its result or raises."""

    def __init__(self, requests: list[Request], finalize: Callable[[], Any],
                 default_timeout: float, failure: Callable[[], PSError | None],
                 customer: Customer | None = None, watch: StallWatch = NO_WATCH):
        self._requests = requests
        self._customer = customer
        self._finalize = finalize
        self._timeout = default_timeout
        self._failure = failure
        self._watch = watch
        self._result: Any = None
        self._done = False

    @property
    def done(self) -> bool:
        return self._done or all(r.event.is_set() for r in self._requests)

    def add_done_callback(self, fn: Callable[[Handle], None]) -> None:
        """Call ``fn(handle)`` once every reply arrived (or the call failed), usually on the
        I/O thread; ``handle.wait()`` inside it returns at once (or raises the error)."""
        if self._customer is None:
            raise ValueError("this handle cannot take callbacks")
        if not self._requests:
            fn(self)
            return
        countdown = _Countdown(len(self._requests), lambda: fn(self))
        for req in self._requests:
            self._customer.when_done(req, countdown.tick)

    def abandon(self, exc: PSError) -> None:
        """Stop waiting for the replies that have not come: ``wait()`` raises ``exc``. For a
        call a check has shown can never complete; without this its requests stay open
        until ``close()``, which would wait them out."""
        if self._customer is not None:
            for req in self._requests:
                self._customer.fail(req, exc)

    def wait(self, timeout: float | None = None) -> Any:
        """Block until every reply arrived (``timeout`` s, default PS_REQUEST_TIMEOUT)."""
        if not self._done:
            deadline = Deadline(self._timeout if timeout is None else timeout)
            for req in self._requests:
                req.wait(deadline, self._failure, self._watch)
            self._result = self._finalize()
            self._done = True
        return self._result
