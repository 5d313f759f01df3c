"""Horovod's timeline for a ps job: a chrome://tracing file of this worker's collectives.

Horovod writes it on rank 0 (``HOROVOD_TIMELINE``, ``hvd.start_timeline``): one row per
tensor, a bar per phase. A ps collective is a request to the servers, so its phases are what
a worker sees: ``NEGOTIATE_<OP>`` is the first use of a name (the sum that checks every worker
asked for the same tensor), ``<OP>`` the request itself, from the call until its result is
in; the time the servers wait for the slowest worker is inside that bar. With ``mark_cycles``,
``CYCLE_START`` marks each time the worker's queued requests leave together (ps's analogue of
Horovod's background cycle, where small tensors are fused).

The file is a JSON array written as the spans end, flushed each time, so a job that dies
leaves a file chrome://tracing still reads; ``close()`` ends the array (then it is JSON).
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, TextIO

Row = Callable[[Any], "tuple[str, str] | None"]     # a request's key -> (tensor row, phase), None: not shown


class Timeline:
    def __init__(self, path: str, row: Row, mark_cycles: bool = False):
        self._file: TextIO | None = open(path, "w")     # noqa: SIM115 - closed by close()
        self._row = row
        self.mark_cycles = mark_cycles
        self._pids: dict[str, int] = {}
        self._lock = threading.Lock()          # spans end on the I/O thread, calls start on the caller's
        self._t0 = time.perf_counter()
        self._file.write("[\n")
        self._write({"name": "process_name", "ph": "M", "pid": 0,
                     "args": {"name": "ps", "start_time_since_epoch_in_micros": int(time.time() * 1e6)}})

    def started(self, key: Any) -> Callable[[], None] | None:
        """A request on ``key`` left; returns what to call when its result is in (None: not
        shown, or the timeline is closed)."""
        shown = self._row(key)
        if shown is None or self._file is None:
            return None
        row, phase = shown
        start = time.perf_counter()

        def ended() -> None:
            now = time.perf_counter()
            with self._lock:
                if self._file is not None:
                    self._write({"name": phase, "ph": "X", "pid": self._pid(row), "tid": 0,
                                 "ts": self._us(start), "dur": self._us(now) - self._us(start)})
        return ended

    def cycle(self) -> None:
        """Queued requests left together (only with ``mark_cycles``)."""
        if self.mark_cycles:
            with self._lock:
                if self._file is not None:
                    self._write({"name": "CYCLE_START", "ph": "i", "s": "g", "pid": 0, "tid": 0,
                                 "ts": self._us(time.perf_counter())})

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.write("{}]\n")       # the writes before end in ",\n": an empty object closes the list
                self._file.close()
                self._file = None

    def _pid(self, row: str) -> int:
        pid = self._pids.get(row)
        if pid is None:
            pid = self._pids[row] = len(self._pids) + 1
            self._write({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": row}})
            self._write({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
        return pid

    def _us(self, t: float) -> int:
        return int((t - self._t0) * 1e6)

    def _write(self, event: dict) -> None:
        assert self._file is not None
        self._file.write(json.dumps(event) + ",\n")
        self._file.flush()
