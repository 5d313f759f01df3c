"""Child processes that end with the process that started them, however it ends (kill -9
included): Linux's parent-death signal (``PR_SET_PDEATHSIG``).

Linux sends that signal when the *thread* that forked exits, not the process. So children are
forked from the main thread, or else from one daemon thread that lasts as long as the process
(``ps-fork``): ``hvd.init()`` called from a short-lived thread must not stop the servers it
started when that thread ends. Elsewhere than Linux the children are plain ones.
"""
from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

FORK_WAIT = 60.0     # seconds a fork handed to the lasting thread may take

try:
    _PRCTL: Callable[..., int] | None = ctypes.CDLL(None).prctl   # looked up here: no dlopen after fork
except (OSError, AttributeError, TypeError):     # no libc prctl: not Linux
    _PRCTL = None
_PR_SET_PDEATHSIG = 1

_forks: queue.Queue | None = None
_forks_lock = threading.Lock()


def popen(argv: list[str], sig: int = signal.SIGTERM, **popen_kw: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **popen_kw)`` whose child gets ``sig`` when this process dies."""
    def fork() -> subprocess.Popen:
        parent = os.getpid()
        return subprocess.Popen(argv, preexec_fn=lambda: _die_with_parent(sig, parent), **popen_kw)
    if threading.current_thread() is threading.main_thread():
        return fork()
    return _in_the_lasting_thread(fork)


def _die_with_parent(sig: int, parent: int) -> None:
    """In the child, between fork and exec."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:      # the parent died between fork and prctl: no signal will come
            os.kill(os.getpid(), sig)


def _forget_the_forker() -> None:
    """In a child forked by os.fork (multiprocessing): the lasting thread did not come along."""
    global _forks, _forks_lock
    _forks, _forks_lock = None, threading.Lock()


def _in_the_lasting_thread(fork: Callable[[], subprocess.Popen]) -> subprocess.Popen:
    global _forks
    with _forks_lock:
        if _forks is None:
            _forks = queue.Queue()
            threading.Thread(target=_forker, args=(_forks,), name="ps-fork", daemon=True).start()
    done: queue.Queue = queue.Queue()
    _forks.put((fork, done))
    try:
        ok, value = done.get(timeout=FORK_WAIT)
    except queue.Empty:
        raise RuntimeError(f"starting a child process took more than {FORK_WAIT:g}s") from None
    if not ok:
        raise value
    return value


def _forker(requests: queue.Queue) -> None:
    while True:
        fork, done = requests.get()
        try:
            done.put((True, fork()))
        except BaseException as exc:       # handed to the caller, which raises it
            done.put((False, exc))


os.register_at_fork(after_in_child=_forget_the_forker)
