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


def watch(procs: list[subprocess.Popen], finished: threading.Event,
          every: float = 0.25, first: float = 3.0, fast: float = 0.05) -> ProcessSample:
    """The largest of each over samples from launch until ``finished``: every ``fast`` s for
    the ``first`` seconds, then every ``every`` s. A quick job (3 steps of 50 ms) holds its
    connections for a few tenths of a second, from formation to its close, which samples
    0.25 s apart can miss; a long job is sampled often enough at ``every`` without taking
    CPU from the job it measures."""
    best = ProcessSample(0.0, 0.0, 0.0)
    start = time.monotonic()
    while True:
        now = sample(procs)
        best = ProcessSample(*(max(a, b) for a, b in zip(best, now)))
        if finished.wait(fast if time.monotonic() - start < first else every):
            return best


def sample(procs: list[subprocess.Popen]) -> ProcessSample:
    """Each process's RSS, established TCP connections and threads, the largest of each. The
    host wrapper (``ip netns exec``) execs, so the pid is the Python process's."""
    rss, conns, threads = [], [], []
    for p in procs:
        try:
            proc = psutil.Process(p.pid)
            for child in [proc, *proc.children(recursive=True)]:
                if "python" not in child.name():
                    continue
                rss.append(child.memory_info().rss / 2**20)
                conns.append(established(child.pid))
                threads.append(child.num_threads())
        except psutil.Error:
            continue
    return ProcessSample(max(rss, default=0.0), max(conns, default=0.0), max(threads, default=0.0))


def established(pid: int) -> int:
    """TCP connections of ``pid`` that are established, read from its own network namespace's
    table (psutil reads the caller's, where a namespace host's sockets are not)."""
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        inodes = {link[len("socket:["):-1] for link in links if link.startswith("socket:[")}
        count = 0
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{pid}/net/{table}") as fh:
                next(fh)
                for line in fh:
                    fields = line.split()
                    count += fields[3] == "01" and fields[9] in inodes      # 01: ESTABLISHED
        return count
    except OSError:         # gone, or a socket closed while we read
        return 0


def cpu_seconds(proc: subprocess.Popen | None) -> float:
    """CPU seconds of ``proc``'s Python process so far (0 when gone or none)."""
    if proc is None:
        return 0.0
    try:
        p = psutil.Process(proc.pid)
        return sum(sum(c.cpu_times()[:2]) for c in [p, *p.children(recursive=True)])
    except psutil.Error:
        return 0.0
