"""How busy the hosts' links were during a multi-host run, seen from the switch.

A step longer than its bound has two causes that need different fixes: the links idle
(nothing to send yet: compute, or a server waiting for the slowest worker's push), or the
links busy below their rate (the senders' windows, TCP's congestion window, CPU). The
step time alone does not tell them apart; the links' byte counters every 10 ms do.

``python -m ps.bench.linkload OUT`` runs in the switch namespace (one process reads every
host's port counters, so sampling costs one cheap file read per tick) until SIGTERM, then
writes its samples to OUT as JSON.
"""
from __future__ import annotations

import bisect
import json
import os
import signal
import sys
import time
from typing import NamedTuple

from .netns import net_dev

TICK = 0.005        # seconds between samples
BIN = 0.01          # seconds per utilisation bin
BUSY = 0.05         # a bin in which some host's link carried at least this share of its rate is busy


class LinkLoad(NamedTuple):
    busy_util: float    # mean utilisation of the hosts' outgoing links over the bins in which any link was busy
    idle_s: float       # seconds per step in which no host's link carried anything


def _read(fd: int, ports: tuple[str, ...]) -> list[int]:
    """[received, sent] bytes of each port (received at the switch = sent by its host).
    ``fd``: /proc/net/dev, kept open; a read at offset 0 gives the counters anew, at half
    the cost of opening the file for each of 200 samples a second."""
    parts, at = [], 0
    while chunk := os.pread(fd, 1 << 16, at):     # the kernel gives a page or so a read
        parts.append(chunk)
        at += len(chunk)
    counts = net_dev(b"".join(parts).decode())
    return [n for port in ports for n in counts.get(port, (0, 0))]


def sample(out: str, ports: tuple[str, ...]) -> None:
    rows: list[tuple[float, list[int]]] = []
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    fd = os.open("/proc/net/dev", os.O_RDONLY)
    while not stop:
        rows.append((time.monotonic(), _read(fd, ports)))
        time.sleep(TICK)
    os.close(fd)
    with open(out, "w") as fh:
        json.dump({"ports": ports, "rows": rows}, fh)


def summarize(path: str, rate: float, start: float, end: float, steps: int) -> LinkLoad:
    """The timed window [start, end] (time.monotonic of this machine: the clock the sampler
    used) of the samples at ``path``; ``rate`` in bytes per second."""
    with open(path) as fh:
        data = json.load(fh)
    rows = data["rows"]
    times = [t for t, _ in rows]
    hosts = len(data["ports"])

    def at(t: float) -> list[int]:
        return rows[min(bisect.bisect_left(times, t), len(rows) - 1)][1]

    busy, idle = [], 0
    t = start
    while t + BIN <= end:
        a, b = at(t), at(t + BIN)
        # not capped at 1: a bin's edges fall between samples, so a bin over 100 % follows one
        # under it; the mean over many bins stays right
        out = [(b[2 * h] - a[2 * h]) / BIN / rate for h in range(hosts)]
        if max(out) >= BUSY:
            busy.append(sum(out) / hosts)
        else:
            idle += 1
        t += BIN
    return LinkLoad(sum(busy) / len(busy) if busy else 0.0, idle * BIN / max(1, steps))


if __name__ == "__main__":
    sample(sys.argv[1], tuple(sys.argv[2:]))
