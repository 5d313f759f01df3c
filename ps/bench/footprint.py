"""A multi-host job's footprint, as ``ps.bench --hosts`` reports it: each process's RSS, TCP
connections and threads (the largest over the run), and a process's CPU seconds. The hosts
are network namespaces, so connections are read from each process's own namespace."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import NamedTuple

import psutil


class ProcessSample(NamedTuple):
    """The job's processes while it ran: the largest of each (scheduler included)."""

    rss_mb: float
    conns: float            # TCP connections established
    threads: float


def watch(procs: list[subprocess.Popen], finished: threading.Event, every: float = 0.25, first: float = 3.0,
          fast: float = 0.05, settle: float = 2.0, conns_every: float = 10.0, duty: float = 0.1) -> ProcessSample:
    """The largest of each over samples from launch until ``finished``: every ``fast`` s for
    the ``first`` seconds, then every ``every`` s. A quick job (3 steps of 50 ms) holds its
    connections for a few tenths of a second, from formation to its close, which samples
    0.25 s apart can miss; a long job is sampled often enough at ``every`` without taking
    CPU from the job it measures.

    Connections are the dear part: each read of a namespace's TCP tables (IPv4 and IPv6) walks
    its whole connection hash. The hosts have small ones of their own (``netns.HOST_EHASH``:
    0.25 ms a host); a namespace that shares the machine's (Linux before 6.1; 262,144 buckets
    here) takes 11 ms a host, 0.12 s for 9 hosts, counted in the run's CPU load. So each
    host's tables are read once per sample: at every sample until ``settle`` s after the
    job's first connection (a quick job's last only a few tenths of a second; a native job
    forms many seconds after launch, and its processes connect within a second of each
    other), then every ``conns_every`` s, and never for more than ``duty`` of the time: a
    read that took d seconds waits at least d / duty for the next."""
    best = ProcessSample(0.0, 0.0, 0.0)
    start = time.monotonic()
    conns_at, conns_cost, connected_at = float("-inf"), 0.0, None
    while True:
        now = time.monotonic()
        settling = connected_at is None or now - connected_at < settle
        with_conns = settling or now - conns_at >= max(conns_cost / duty, conns_every)
        got = sample(procs, with_conns)
        if with_conns:
            conns_at, conns_cost = now, time.monotonic() - now
        if connected_at is None and got.conns:
            connected_at = now
        best = ProcessSample(*(max(a, b) for a, b in zip(best, got)))
        if finished.wait(fast if time.monotonic() - start < first else every):
            return best


def sample(procs: list[subprocess.Popen], with_conns: bool = True) -> ProcessSample:
    """Each process's RSS, established TCP connections (0 unless ``with_conns``) and threads,
    the largest of each. The host wrapper (``ip netns exec``) execs, so the pid is the Python
    process's (until it execs, the pid is ``ip``'s: skipped). Not its children: psutil finds
    them by reading every process's stat, and for each of 17 processes four times a second
    that took a quarter of a core, counted in the run's CPU load."""
    rss, conns, threads = [], [], []
    tables: dict[str, set[str]] = {}        # network namespace -> its established sockets' inodes
    for p in procs:
        try:
            proc = psutil.Process(p.pid)
            with proc.oneshot():
                if "python" not in proc.name():
                    continue
                rss.append(proc.memory_info().rss / 2**20)
                threads.append(proc.num_threads())
            if with_conns:
                conns.append(established(proc.pid, tables))
        except psutil.Error:
            continue
    return ProcessSample(max(rss, default=0.0), max(conns, default=0.0), max(threads, default=0.0))


def established(pid: int, tables: dict[str, set[str]]) -> int:
    """TCP connections of ``pid`` that are established, read from its own network namespace's
    table (psutil reads the caller's, where a namespace host's sockets are not). ``tables``
    keeps each namespace's established sockets, so processes of one host read its table once."""
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        inodes = {link[len("socket:["):-1] for link in links if link.startswith("socket:[")}
        space = os.readlink(f"/proc/{pid}/ns/net")
        if space not in tables:
            tables[space] = _established_inodes(pid)
        return len(inodes & tables[space])
    except OSError:         # gone, or a socket closed while we read
        return 0


def _established_inodes(pid: int) -> set[str]:
    """The inodes of the established TCP sockets in ``pid``'s network namespace (IPv6 too:
    native MXNet's sockets are, with IPv4 addresses mapped)."""
    found = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as fh:
            next(fh)
            for line in fh:
                fields = line.split()
                if fields[3] == "01":           # 01: ESTABLISHED
                    found.add(fields[9])
    return found


def cpu_seconds(proc: subprocess.Popen | None) -> float:
    """CPU seconds of ``proc``'s Python process so far (0 when gone or none)."""
    if proc is None:
        return 0.0
    try:
        p = psutil.Process(proc.pid)
        return sum(sum(c.cpu_times()[:2]) for c in [p, *p.children(recursive=True)])
    except psutil.Error:
        return 0.0
