"""The multi-host benchmark's link sampler (ps/bench/linkload.py) reads /proc/net/dev from a
descriptor it keeps open, in as many reads as the kernel needs (a page or so each): the counts
must be those of a fresh open and read."""
from __future__ import annotations

import os

from ps.bench import linkload
from ps.bench.netns import net_dev


def test_a_kept_descriptor_reads_the_counters_a_fresh_open_reads():
    fd = os.open("/proc/net/dev", os.O_RDONLY)
    try:
        with open("/proc/net/dev") as fh:
            names = list(net_dev(fh.read()))
        before = linkload._read(fd, (*names, "no-such-port"))
        with open("/proc/net/dev") as fh:
            fresh = net_dev(fh.read())
        after = linkload._read(fd, (*names, "no-such-port"))
    finally:
        os.close(fd)
    assert before[-2:] == after[-2:] == [0, 0]
    for i, name in enumerate(names):     # counters only grow between the reads
        assert before[2 * i] <= fresh[name][0] <= after[2 * i], name
        assert before[2 * i + 1] <= fresh[name][1] <= after[2 * i + 1], name
    assert names, "no interface in /proc/net/dev"
