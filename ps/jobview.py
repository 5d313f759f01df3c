"""The scheduler's picture of a running job for the dashboard (ps/dashboard): the nodes'
latest reports (ps/nodestats.py), a short history of the job's rates, the current stalls,
and the events (joined, died, restarted, stalled, went on, ended).

Events are found by comparing what the scheduler knows at each of its ticks with the tick
before (:meth:`JobView.observe`), so the scheduler's paths that change a node's state
(formation, deaths, restarts, closes) need no call of their own. Reports come from the
network: only the known fields, of the known types and bounded sizes, are kept.
"""
from __future__ import annotations

import collections
import math
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .nodestats import BUCKETS, MAX_STALL_KEYS, MAX_STALLS

HISTORY = 600           # samples kept: 10 minutes at one a second
EVENTS = 200            # events kept
SAMPLE = 1.0            # s between two history samples
SILENT = 3              # report intervals without a report: the node shows as silent
_NUMBERS = ("bytes_sent", "bytes_received", "messages_sent", "messages_received", "resent", "cpu_seconds",
            "rss_bytes", "in_flight", "step", "rounds_closed", "stalled_seconds", "latency_sum")
_MAX_RANKS = 64         # ranks kept per stall's missing and waiting lists


@dataclass(frozen=True)
class NodeFacts:
    """A node as the scheduler knows it (its membership), at one moment."""

    node_id: int
    name: str               # W9, S8
    role: str               # "server" | "worker"
    rank: int
    host: str
    hostname: str
    pid: int | None
    registered: float       # wall-clock time this incarnation registered
    incarnation: int        # 0, or the job's restart count when this process was admitted
    state: str              # "alive" | "dead" | "restarting" | "closed" | "ended"
    reason: str | None = None   # why it is dead


@dataclass(frozen=True)
class BarrierStall:
    group: str
    missing: tuple[str, ...]     # described nodes
    arrived: tuple[str, ...]
    seconds: float


@dataclass(frozen=True)
class JobFacts:
    """The job as the scheduler knows it, taken under its lock."""

    state: str                      # "forming" | "running" | "ended"
    kvstore: str | None
    workers: int
    servers: int
    restarts: int
    interval: float                 # PS_HEARTBEAT_INTERVAL
    nodes: tuple[NodeFacts, ...] = ()
    barriers: tuple[BarrierStall, ...] = ()
    ended: tuple[int, str] | None = None    # exit code, reason


@dataclass
class _Reported:
    """A node's last two reports and when (monotonic) they came: rates are their difference."""

    last: dict[str, Any]
    at: float
    before: dict[str, Any] | None = None
    before_at: float = 0.0


@dataclass
class _Sample:
    """Counters at the last history sample, per node id."""

    at: float
    sent: dict[int, float] = field(default_factory=dict)
    steps: dict[int, float] = field(default_factory=dict)
    buckets: dict[int, list[int]] = field(default_factory=dict)


def clean(body: Any) -> dict[str, Any] | None:
    """A report as a node sent it, less anything unknown, of the wrong type, or too large."""
    if not isinstance(body, dict):
        return None
    out: dict[str, Any] = {}
    for name in _NUMBERS:
        value = body.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            out[name] = value
    buckets = body.get("latency_buckets")
    if isinstance(buckets, list) and len(buckets) == len(BUCKETS) + 1 and \
            all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in buckets):
        out["latency_buckets"] = buckets
    stalls = body.get("stalls")
    if isinstance(stalls, list):
        out["stalls"] = [s for s in map(_clean_stall, stalls[:MAX_STALLS]) if s is not None]
    return out


def _ints(value: Any, limit: int) -> list[int] | None:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return value[:limit]


def _clean_stall(stall: Any) -> dict[str, Any] | None:
    if not isinstance(stall, dict):
        return None
    keys, missing = _ints(stall.get("keys"), MAX_STALL_KEYS), _ints(stall.get("missing"), _MAX_RANKS)
    waiting, rnd, seconds = _ints(stall.get("waiting"), _MAX_RANKS), stall.get("round"), stall.get("seconds")
    if keys is None or missing is None or waiting is None or not isinstance(rnd, int) or \
            not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return None
    return {"round": rnd, "keys": keys, "missing": missing, "waiting": waiting, "seconds": float(seconds)}


def quantile(q: float, counts: list[int]) -> float | None:
    """The ``q`` quantile of a bucketed histogram, linear within its bucket (as Prometheus'
    histogram_quantile); None if it is empty. The +Inf bucket answers its lower bound."""
    total = sum(counts)
    if total <= 0:
        return None
    rank, seen = q * total, 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i == len(BUCKETS):
                return BUCKETS[-1]
            lo = BUCKETS[i - 1] if i else 0.0
            return lo + (BUCKETS[i] - lo) * (rank - seen) / n
        seen += n
    return BUCKETS[-1]


class JobView:
    """Thread-safe: reports arrive on the scheduler's I/O thread, ``observe`` runs on its
    tick, and the dashboard's threads read ``state``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.clock, self.wall = clock, wall
        self.started = clock()
        self._lock = threading.Lock()
        self._reports: dict[int, _Reported] = {}
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=EVENTS)
        self._history: collections.deque[dict[str, Any]] = collections.deque(maxlen=HISTORY)
        self._sample: _Sample | None = None
        self._seen: dict[int, NodeFacts] = {}       # as at the last observe
        self._restarts: collections.Counter[int] = collections.Counter()   # node id -> times restarted
        self._stalls: dict[tuple[str, str], dict[str, Any]] = {}   # (by, what) -> current stall
        self._ended = False
        self._formed = False

    # -- input -------------------------------------------------------------------------
    def report(self, node_id: int, body: Any) -> None:
        """A heartbeat's report (I/O thread)."""
        report = clean(body)
        if report is None:
            return
        with self._lock:
            now, old = self.clock(), self._reports.get(node_id)
            if old is None:
                self._reports[node_id] = _Reported(report, now)
            else:
                self._reports[node_id] = _Reported(report, now, old.last, old.at)

    def forget(self, node_id: int) -> None:
        """A restart takes the node's place: its counters start again from zero."""
        with self._lock:
            self._reports.pop(node_id, None)

    def observe(self, facts: JobFacts) -> None:
        """The scheduler's tick: note what changed since the last one as events, and take a
        history sample once a second."""
        with self._lock:
            self._observe_nodes(facts)
            if facts.state != "forming" and not self._formed:
                self._formed = True
                self._event("formed", None, f"the cluster formed: {facts.workers} workers, {facts.servers} "
                                            f"servers ({facts.kvstore})")
            self._observe_stalls(facts)
            if facts.ended is not None and not self._ended:
                self._ended = True
                code, reason = facts.ended
                self._event("ended", None, "the job finished" if code == 0 else f"the job failed: {reason}")
            now = self.clock()
            if self._sample is None or now - self._sample.at >= SAMPLE:
                self._take_sample(now, facts)

    def _observe_nodes(self, facts: JobFacts) -> None:
        for node in facts.nodes:
            seen = self._seen.get(node.node_id)
            label = f"{node.role} {node.rank}"
            if seen is None:
                self._event("joined", label, f"{label} ({node.name} on {node.host}, pid {node.pid}) joined")
            elif node.incarnation != seen.incarnation:
                self._reports.pop(node.node_id, None)
                self._restarts[node.node_id] += 1
                self._event("restarted", label, f"{label} restarted on {node.host} (pid {node.pid}, "
                                                f"restart {node.incarnation} of the job)")
            elif node.state != seen.state and node.state == "dead":
                self._event("died", label, f"{label}: {node.reason or 'died'}")
            elif node.state != seen.state and node.state == "closed":
                self._event("closed", label, f"{label} finished (closed its store)")
            self._seen[node.node_id] = node

    def _observe_stalls(self, facts: JobFacts) -> None:
        current = {(s["by"], s["what"]): s for s in self._current_stalls(facts)}
        for key, stall in current.items():
            if key not in self._stalls:
                self._event("stalled", stall["by"], stall["text"])
        for key, stall in self._stalls.items():
            if key not in current:
                self._event("went_on", stall["by"], f"{stall['by']}: the stalled {stall['what']} went on")
        self._stalls = current

    def _event(self, kind: str, node: str | None, text: str) -> None:
        self._events.append({"t": self.wall(), "kind": kind, "node": node, "text": text})

    # -- rates ---------------------------------------------------------------------------
    def _take_sample(self, now: float, facts: JobFacts) -> None:
        sample = _Sample(now)
        workers = {n.node_id for n in facts.nodes if n.role == "worker" and n.state == "alive"}
        for node_id, rep in self._reports.items():
            sample.sent[node_id] = rep.last.get("bytes_sent", 0)
            if node_id in workers:
                sample.steps[node_id] = rep.last.get("step", 0)
                if "latency_buckets" in rep.last:
                    sample.buckets[node_id] = rep.last["latency_buckets"]
        prev, self._sample = self._sample, sample
        if prev is None:
            return
        dt = now - prev.at
        sent = sum(_delta(v, prev.sent.get(i)) for i, v in sample.sent.items())
        rates = [_delta(v, prev.steps.get(i)) / dt for i, v in sample.steps.items() if i in prev.steps]
        counts = [0] * (len(BUCKETS) + 1)
        for i, b in sample.buckets.items():
            old = prev.buckets.get(i)
            for j, n in enumerate(b):
                counts[j] += n - old[j] if old is not None and n >= old[j] else n
        self._history.append({"t": self.wall(), "steps_per_second": statistics.median(rates) if rates else None,
                              "bytes_per_second": sent / dt, "latency_p50": quantile(0.5, counts),
                              "latency_p95": quantile(0.95, counts)})

    # -- output --------------------------------------------------------------------------
    def state(self, facts: JobFacts) -> dict[str, Any]:
        """Everything the page shows (docs/dashboard.md describes each field)."""
        with self._lock:
            nodes = [self._node(n, facts.interval) for n in facts.nodes]
            history = {name: [h[name] for h in self._history] for name in
                       ("t", "steps_per_second", "bytes_per_second", "latency_p50", "latency_p95")}
            rate = next((h["steps_per_second"] for h in reversed(self._history) if h["steps_per_second"] is not None),
                        None)
            steps = [n["step"] for n in nodes if n["role"] == "worker" and n["step"] is not None]
            job = {"state": facts.state, "kvstore": facts.kvstore, "workers": facts.workers, "servers": facts.servers,
                   "uptime": self.clock() - self.started, "restarts": facts.restarts,
                   "step": int(statistics.median(steps)) if steps else None, "steps_per_second": rate,
                   "ended": {"code": facts.ended[0], "reason": facts.ended[1]} if facts.ended else None,
                   "now": self.wall(), "interval": facts.interval}
            return {"job": job, "nodes": nodes, "history": history, "stalls": list(self._stalls.values()),
                    "events": list(self._events)}

    def reports(self) -> dict[int, dict[str, Any]]:
        """Each node's last report, as cleaned (the metrics' source)."""
        with self._lock:
            return {i: dict(r.last) for i, r in self._reports.items()}

    def _node(self, node: NodeFacts, interval: float) -> dict[str, Any]:
        rep = self._reports.get(node.node_id)
        now = self.clock()
        last = rep.last if rep is not None else {}
        heard = now - rep.at if rep is not None else None
        state = node.state
        if state == "alive" and interval and (heard is None or heard > SILENT * interval) and \
                self.wall() - node.registered > SILENT * interval:     # (a first report takes an interval)
            state = "silent"
        row = {"id": node.node_id, "name": node.name, "role": node.role, "rank": node.rank, "host": node.host,
               "hostname": node.hostname, "pid": node.pid, "state": state, "last_heard": heard,
               "since": node.registered, "restarts": self._restarts[node.node_id], "reason": node.reason,
               "rss_bytes": last.get("rss_bytes"), "in_flight": last.get("in_flight", 0),
               "step": last.get("step") if node.role == "worker" else None,
               "rounds_closed": last.get("rounds_closed") if node.role == "server" else None,
               "cpu_percent": None, "bytes_in_per_s": None, "bytes_out_per_s": None}
        if state == "alive" and rep is not None and rep.before is not None and rep.at > rep.before_at:
            # (a silent node's last rates would be stale: unknown instead)
            dt = rep.at - rep.before_at
            row["cpu_percent"] = 100 * _delta(last.get("cpu_seconds", 0), rep.before.get("cpu_seconds")) / dt
            row["bytes_in_per_s"] = _delta(last.get("bytes_received", 0), rep.before.get("bytes_received")) / dt
            row["bytes_out_per_s"] = _delta(last.get("bytes_sent", 0), rep.before.get("bytes_sent")) / dt
        return row

    def _current_stalls(self, facts: JobFacts) -> list[dict[str, Any]]:
        """The servers' reported stalls, named as their warnings name them, and the
        scheduler's own (barriers)."""
        names = {(n.role, n.rank): f"{n.role} {n.rank} ({n.name} on {n.host})" for n in facts.nodes}
        stalls = []
        for node in facts.nodes:
            rep = self._reports.get(node.node_id)
            if node.role != "server" or rep is None or node.state != "alive":
                continue
            by = f"server {node.rank}"
            for s in rep.last.get("stalls", ()):
                keys = ", ".join(map(str, s["keys"]))
                what = f"sync round {s['round']} of key{'s' if len(s['keys']) > 1 else ''} {keys}"
                waiting_for = [names.get(("worker", r), f"worker {r}") for r in s["missing"]]
                waiting = [f"worker {r}" for r in s["waiting"]]
                stalls.append({"by": by, "what": what, "keys": s["keys"], "waiting_for": waiting_for,
                               "waiting": waiting, "seconds": s["seconds"],
                               "text": f"{by}: {what} has waited {s['seconds']:.0f}s for {', '.join(waiting_for)}"
                                       + (f"; {', '.join(waiting)} pushed and wait" if waiting else "")})
        for b in facts.barriers:
            what = f"barrier '{b.group}'"
            stalls.append({"by": "scheduler", "what": what, "keys": [], "waiting_for": list(b.missing),
                           "waiting": list(b.arrived), "seconds": b.seconds,
                           "text": f"scheduler: {what} has waited {b.seconds:.0f}s for {', '.join(b.missing)}"})
        return stalls


def _delta(value: float, before: float | None) -> float:
    """How much a counter grew; a counter smaller than before was reset (its node restarted)."""
    if before is None or value < before:
        return value if before is not None else 0.0
    return value - before
