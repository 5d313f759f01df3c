"""Horovod's timeline for a ps job: a chrome://tracing file of this worker's collectives.

Horovod writes it on rank 0 (``HOROVOD_TIMELINE``, ``hvd.start_timeline``): one row per
tensor, a bar per phase. A ps collective is a request to the servers, so its phases are what
a worker sees: ``NEGOTIATE_<OP>`` is a call's first use of new names (the sum that checks every
worker asked for the same tensors), ``<OP>`` the request itself, from the call until its result
is in; the time the servers wait for the slowest worker is inside that bar. With
``mark_cycles``, ``CYCLE_START`` marks each time the worker's queued requests leave together
(ps's counterpart of Horovod's background cycle, where small tensors are fused).

Events are written as their bars end and flushed, so a job that dies leaves a file
chrome://tracing still reads (a JSON array without its closing bracket, as Horovod's);
``close()``, also run at exit, ends the array, and the file is then plain JSON. A write
that fails (a full disk) stops the timeline with one warning: tracing must never fail the
training it traces.
"""
from __future__ import annotations

import atexit
import json
import logging
import threading
import time
import weakref
from typing import Any, Callable, NamedTuple, TextIO

logger = logging.getLogger(__name__)


class Bar(NamedTuple):
    row: str            # the tensor, as Horovod names its row: "allreduce.w"
    phase: str          # "ALLREDUCE", "NEGOTIATE_ALLREDUCE", ...


class Timeline:
    def __init__(self, path: str, bar: Callable[[Any], Bar | None], mark_cycles: bool = False):
        """``bar(key)``: how a request on ``key`` is shown; None: not at all."""
        self.path = path
        self._file: TextIO | None = open(path, "w")     # noqa: SIM115 - closed by close()
        self._bar = bar
        self.mark_cycles = mark_cycles
        self._pids: dict[str, int] = {}
        self._lock = threading.Lock()          # bars end on the I/O thread, calls start on the caller's
        self._t0 = time.perf_counter()
        self._first = True
        self._emit({"name": "process_name", "ph": "M", "pid": 0,
                    "args": {"name": "ps", "start_time_since_epoch_in_micros": int(time.time() * 1e6)}})
        ref = weakref.ref(self)
        self._atexit = lambda: ref() is not None and ref().close()
        atexit.register(self._atexit)

    def started(self, key: Any) -> Callable[[], None] | None:
        """A request on ``key`` left; returns what to call when its result is in (None: not
        shown, or the timeline is closed)."""
        bar = self._bar(key)
        if bar is None or self._file is None:
            return None
        start = time.perf_counter()

        def ended() -> None:
            now = time.perf_counter()
            with self._lock:
                if self._file is not None:
                    self._emit({"name": bar.phase, "ph": "X", "pid": self._pid(bar.row), "tid": 0,
                                "ts": self._us(start), "dur": self._us(now) - self._us(start)})
        return ended

    def cycle(self) -> None:
        """Queued requests left together (shown only with ``mark_cycles``)."""
        if self.mark_cycles:
            with self._lock:
                if self._file is not None:
                    self._emit({"name": "CYCLE_START", "ph": "i", "s": "g", "pid": 0, "tid": 0,
                                "ts": self._us(time.perf_counter())})

    def close(self) -> None:
        """End the file (idempotent); bars that end later are not shown."""
        with self._lock:
            if self._file is not None:
                try:
                    self._file.write("\n]\n")
                    self._file.close()
                except OSError as exc:
                    logger.warning("timeline %s: could not finish the file: %s", self.path, exc)
                self._file = None
        atexit.unregister(self._atexit)

    def _pid(self, row: str) -> int:
        pid = self._pids.get(row)
        if pid is None:
            pid = self._pids[row] = len(self._pids) + 1
            self._emit({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": row}})
            self._emit({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
        return pid

    def _us(self, t: float) -> int:
        return int((t - self._t0) * 1e6)

    def _emit(self, event: dict) -> None:
        if self._file is None:
            return
        try:
            self._file.write(("[\n" if self._first else ",\n") + json.dumps(event))
            self._file.flush()
            self._first = False
        except OSError as exc:
            logger.warning("timeline %s stopped: %s", self.path, exc)
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
