"""A server process's malloc: keep freed memory for the next round instead of giving it back.

A server reads every pushed chunk (1 MiB by default) into a fresh buffer and frees it once
the round's sum is made. glibc's malloc returns such memory to the kernel as soon as more
than a few MiB are free at the top of a heap, so the next round takes every page again as a
fault, and the kernel zeroes it first: at W4 S2 one 1 MB key cost its server 2.8 ms of CPU a
round, 1.3 ms with 16 MiB kept (``python -m ps.bench --ab``). 64 MiB kept helped 16 MB keys
more (server CPU 21 ms a round against 25) but held the servers' RSS over their limit in
``ps.bench`` (1.25 x what they store + 64 MB). Only server processes, which ps owns: a
worker's malloc is its training script's.
"""
from __future__ import annotations

import ctypes
import logging

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1       # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20   # the most glibc's own sliding threshold reaches on 64-bit


def keep_freed(keep: int) -> bool:
    """Have malloc keep up to ``keep`` bytes free at a heap's top (PS_SERVER_MALLOC_KEEP),
    and serve allocations up to 32 MiB from its heaps: setting one ends glibc's sliding
    thresholds, so both are set. Nothing for 0 or outside glibc; True if set."""
    if keep <= 0:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt     # libc's, among the process's symbols: no
    except (OSError, AttributeError):          # find_library, which runs ldconfig at start-up
        return False            # not glibc (musl, macOS): its malloc has no such knobs
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, min(keep, 2**31 - 1)) == 1
    if not ok:
        logger.debug("mallopt refused the thresholds")
    return ok
