"""A server's profile: what it did with each request, as a Chrome trace (chrome://tracing,
Perfetto), the format MXNet's profiler writes.

MXNet's ``profile_process='server'`` runs MXNet's profiler inside its C++ servers; ps's
servers are Python processes with no MXNet engine, so they record their own work instead:
one span per request entry (a push's merge, and the optimizer update when it closes a
round; a pull; an init), one per batch of replies handed to the transport, and one per
server command. Recording costs two clock reads and a tuple per entry, and nothing while
the profiler is not running.

Commands come from rank 0's worker (``KVStore.server_command("profiler", ...)``, which
ps.mxnet's ``mx.profiler.*(profile_process='server')`` sends, as MXNet's C++ kvstore
does). Like MXNet's server, a server writes ``rank<its rank>_<filename>``; unlike it, the
name must be a plain file name (a peer chooses it: no directories, no dot files) and the
file is written when the profiler stops as well as on ``dump`` and at exit, so it is
there as soon as ``set_state('stop')`` returns.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)

MAX_EVENTS = 2_000_000          # about 200 MB of trace: beyond it, spans are counted and dropped
DEFAULT_FILENAME = "profile.json"


class Span(NamedTuple):
    name: str
    cat: str
    start: float                 # perf_counter seconds
    end: float
    thread: int
    args: dict[str, Any] | None


class ServerProfiler:
    """Owned by one server; ``config``/``state``/``pause``/``dump`` mirror MXNet's calls."""

    def __init__(self, rank: int, label: str) -> None:
        self.rank, self.label = rank, label
        self.filename = f"rank{rank}_{DEFAULT_FILENAME}"
        self.running = False             # read on the hot path: True only while recording
        self._state, self._paused, self._enabled = False, False, False
        self._spans: list[Span] = []
        self._dropped = 0
        self._lock = threading.Lock()
        # perf_counter has no epoch: anchor it to the wall clock so that traces of several
        # servers (and of MXNet's workers) line up when loaded together
        self._epoch_us = time.time() * 1e6 - time.perf_counter() * 1e6

    # -- commands ---------------------------------------------------------------------------
    def command(self, body: dict[str, Any]) -> dict[str, Any]:
        action = body.get("action")
        if action == "config":
            params = body.get("params") or {}
            if not isinstance(params, dict):
                raise ValueError(f"profiler config must be a dict, got {type(params).__name__}")
            if "filename" in params:
                self.filename = f"rank{self.rank}_{_plain_name(params['filename'])}"
                with self._lock:
                    self._spans, self._dropped = [], 0
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.filename)      # as MXNet's SetConfig: no stale profile from an earlier run
        elif action == "state":
            self._state = bool(body.get("run"))
            self._enabled |= self._state
            if not self._state:
                self.write()
        elif action == "pause":
            self._paused = bool(body.get("paused"))
        elif action == "dump":
            self.write(clear=bool(body.get("finished", True)))
        else:
            raise ValueError(f"unknown profiler action {action!r} (config, state, pause, dump)")
        self.running = self._state and not self._paused
        return {"file": os.path.abspath(self.filename), "spans": len(self._spans)}

    # -- recording (I/O thread) ---------------------------------------------------------------
    def record(self, name: str, cat: str, start: float, args: dict[str, Any] | None = None) -> None:
        end = time.perf_counter()
        if len(self._spans) >= MAX_EVENTS:
            self._dropped += 1
            return
        self._spans.append(Span(name, cat, start, end, threading.get_ident(), args))

    # -- output -------------------------------------------------------------------------------
    def write(self, clear: bool = False) -> None:
        """Write every span so far (MXNet's ``dump``); ``clear`` starts afresh after."""
        if not self._enabled:
            return
        with self._lock:
            spans, dropped = list(self._spans), self._dropped
            if clear:
                self._spans, self._dropped = [], 0
        pid = os.getpid()
        events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": pid,
                                         "args": {"name": f"ps {self.label}"}}]
        for s in spans:
            event = {"name": s.name, "cat": s.cat, "ph": "X", "pid": pid, "tid": s.thread,
                     "ts": round(self._epoch_us + s.start * 1e6, 3), "dur": round((s.end - s.start) * 1e6, 3)}
            if s.args:
                event["args"] = s.args
            events.append(event)
        doc = {"traceEvents": events, "displayTimeUnit": "ms",
               "otherData": {"source": "ps server", "rank": self.rank, "dropped_spans": dropped}}
        tmp = f"{self.filename}.tmp{pid}"
        try:
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self.filename)          # a reader never sees half a file
        except OSError as exc:
            raise OSError(f"{self.label}: cannot write its profile {os.path.abspath(self.filename)}: {exc}") from exc
        if dropped:
            logger.warning("%s: profile %s lacks %d spans beyond %d", self.label, self.filename, dropped, MAX_EVENTS)

    def close(self) -> None:
        """At exit, as MXNet's profiler dumps when its process ends."""
        if self._enabled and self._spans:
            try:
                self.write()
            except OSError as exc:
                logger.error("%s", exc)


def _plain_name(name: Any) -> str:
    """A file name a peer may make this server write: in its working directory, never a path."""
    if not isinstance(name, str) or not name or name != os.path.basename(name) or name.startswith(".") \
            or "\0" in name or len(name) > 200:
        raise ValueError(f"profiler filename {name!r}: a server writes rank<N>_<filename> in its working "
                         "directory, so give a plain file name (no directories, not starting with '.')")
    return name
