"""What a server or worker tells the scheduler about itself with each heartbeat, for the
dashboard (ps/jobview.py, ps/dashboard): counters only, so a lost heartbeat loses nothing
(the next one carries the totals) and the scheduler computes every rate itself.

A report is a small msgpack map of numbers, bounded whatever the job's size (a few hundred
bytes; at most MAX_STALLS stalls of MAX_STALL_KEYS keys each), so it rides on a message
that is sent anyway and costs no connection of its own.
"""
from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import psutil

logger = logging.getLogger(__name__)

# s: the upper bounds of a round trip's histogram buckets (the last, +Inf, is implied),
# from a loopback push of a small key to a large one across a slow link
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MAX_STALLS = 8
MAX_STALL_KEYS = 16


class Histogram:
    """Round trips counted per bucket on the I/O thread; a report copies the counts."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds


class StallClock:
    """Seconds spent stalled (a wait past PS_STALL_WARNING that someone named), as a total
    that keeps counting while a stall lasts."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._since: float | None = None
        self._done = 0.0

    def set(self, stalled: bool) -> None:
        now = self._clock()
        if stalled and self._since is None:
            self._since = now
        elif not stalled and self._since is not None:
            self._done += now - self._since
            self._since = None

    def seconds(self) -> float:
        return self._done + (self._clock() - self._since if self._since is not None else 0.0)


@dataclass
class NodeStats:
    """The counters one node reports. ``transport()`` gives the van's counters
    (``transport_stats``); the role adds its own sources with :meth:`add`."""

    transport: Callable[[], dict[str, int]]
    sources: list[Callable[[], dict[str, Any]]] = field(default_factory=list)
    _process: Any = None

    def add(self, source: Callable[[], dict[str, Any]]) -> None:
        self.sources.append(source)

    def report(self) -> dict[str, Any]:
        t = self.transport()
        out: dict[str, Any] = {
            "bytes_sent": t.get("bytes_sent", 0), "bytes_received": t.get("bytes_received", 0),
            "messages_sent": t.get("messages_sent", 0), "messages_received": t.get("messages_received", 0),
            "resent": t.get("resent", 0),
        }
        out.update(self._usage())
        for source in self.sources:
            try:
                out.update(source())
            except Exception:       # on the heartbeat thread: a report short of a part, never no heartbeat
                logger.debug("a node report's source failed", exc_info=True)
        return out

    def _usage(self) -> dict[str, float]:
        """CPU seconds and resident memory of this process (psutil; nothing if it cannot tell)."""
        try:
            if self._process is None:
                self._process = psutil.Process()
            with self._process.oneshot():
                cpu = self._process.cpu_times()
                rss = self._process.memory_info().rss
        except (psutil.Error, OSError):
            return {}
        return {"cpu_seconds": cpu.user + cpu.system, "rss_bytes": rss}


def latency(hist: Histogram) -> dict[str, Any]:
    return {"latency_buckets": list(hist.counts), "latency_sum": hist.total}


def stall_list(stalls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At most MAX_STALLS stalls of at most MAX_STALL_KEYS keys each, the oldest first."""
    stalls = sorted(stalls, key=lambda s: -s.get("seconds", 0.0))[:MAX_STALLS]
    return [{**s, "keys": list(s.get("keys", ()))[:MAX_STALL_KEYS]} for s in stalls]
