"""The multi-host benchmark's footprint sampler (ps/bench/footprint.py) on real processes:
it counts a process's established TCP connections from its namespace's table, reads that
table once per sample for processes that share it, and reads it rarely once the job's
connections have settled (each read walks the kernel's whole connection hash: read for every process four
times a second it took 14% of this machine, counted in the run's CPU load)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil
import pytest

from ps.bench import footprint
from tests.helpers import read_until

pytestmark = pytest.mark.process

# a process holding both ends of one loopback connection, and a listener: 2 established
HOLDER = ("import socket, time\n"
          "l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen()\n"
          "c = socket.create_connection(l.getsockname()); a, _ = l.accept()\n"
          "print('ready', flush=True); time.sleep(60)\n")


@pytest.fixture
def holders():
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in procs:
            read_until(p, lambda line: line.strip() == "ready", 10, "the holder's ready line")
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


@pytest.mark.timeout(60)
def test_connections_are_counted_per_process_from_one_read_of_the_shared_table(holders, monkeypatch):
    reads = []
    real = footprint._established_inodes
    monkeypatch.setattr(footprint, "_established_inodes", lambda pid: reads.append(pid) or real(pid))
    # psutil finds children by reading every process's stat: for 17 processes 4 times a second
    # that was a quarter of a core, counted in the CPU load the benchmark reports
    with monkeypatch.context() as m:
        m.setattr(psutil.Process, "children", lambda *a, **k: pytest.fail("sample walked the process table"))
        got = footprint.sample(holders)
    assert got.conns == 2 and got.threads == 1 and got.rss_mb > 1, got
    assert len(reads) == 1, reads                   # both processes are in this namespace
    assert footprint.sample(holders, with_conns=False).conns == 0
    assert len(reads) == 1


@pytest.mark.timeout(60)
def test_connections_are_read_often_until_they_settle_then_every_conns_every_and_never_over_the_duty(holders,
                                                                                                   monkeypatch):
    """Times, not counts: on a loaded machine the samples come fewer and later. Once settled,
    a read of connections is followed by at least its own duration / duty without one."""
    calls = []
    real = footprint.sample

    def sample(procs, with_conns=True):
        began = time.monotonic()
        got = real(procs, with_conns)
        calls.append((began, time.monotonic(), with_conns))
        return got
    monkeypatch.setattr(footprint, "sample", sample)
    finished = threading.Event()
    timer = threading.Timer(2.5, finished.set)
    timer.start()
    best = footprint.watch(holders, finished, every=0.01, first=0.3, fast=0.01, settle=0.5, conns_every=0.8,
                           duty=0.1)
    timer.join()
    assert best.conns == 2, best
    start = calls[0][0]                     # connected from the first sample: settled 0.5 s later
    settling = [read for began, _, read in calls if began - start < 0.45]
    assert settling and all(settling), calls
    after = [(began, ended) for began, ended, read in calls if read and began - start > 0.55]
    assert 0 < len(after) < len([c for c in calls if c[0] - start > 0.55]), calls
    for (began, ended), (later, _) in zip(after, after[1:]):
        assert later - began > max(0.75, (ended - began) / 0.1), after
