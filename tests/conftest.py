"""Fixtures every test gets: processes killed by group at teardown, and a check that a test
leaves no thread or process of its own behind. Helpers live in tests/helpers.py."""
from __future__ import annotations

import os
import threading

import psutil
import pytest

from tests.helpers import Procs, free_port, poll_for

# seconds a test's threads and processes get to end after it (tests/unit/test_leak_check.py
# runs its leaky tests with less: what it checks is the failure, not the wait)
LEAK_GRACE = float(os.environ.get("TESTS_LEAK_GRACE", "5.0"))
OUR_THREADS = ("ps-", "bench-read")   # names of the threads ps and its tests start


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.cleanup()


@pytest.fixture
def port() -> int:
    """A scheduler port for jobs started by hand: every process must know it before the
    scheduler is up, so it cannot be the scheduler's own port-0 pick (the launcher's is)."""
    return free_port()


def _children() -> dict[int, psutil.Process]:
    try:
        return {p.pid: p for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Fail a test that leaves one of our threads, a non-daemon thread, or a child process
    running; leftover processes are killed by pid first, so they cannot spoil later tests."""
    threads_before = set(threading.enumerate())
    children_before = set(_children())
    yield

    def stray_threads():
        return [t for t in threading.enumerate() if t not in threads_before and t.is_alive()
                and (t.name.startswith(OUR_THREADS) or not t.daemon)]

    def stray_children():
        return [p for pid, p in _children().items() if pid not in children_before and _running(p)]

    poll_for(lambda: not stray_threads() and not stray_children(), LEAK_GRACE, 0.1)
    threads, children = stray_threads(), stray_children()
    problems = [f"thread {t.name!r} (daemon={t.daemon})" for t in threads]
    problems += [f"process {p.pid} {' '.join(_cmdline(p))[:120]!r}" for p in children]   # before the kill
    for proc in children:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(children, timeout=5)     # reap them: no zombies piling up in pytest
    if problems:
        pytest.fail(f"{request.node.nodeid} left running after {LEAK_GRACE:g}s: " + "; ".join(problems),
                    pytrace=False)


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return ["?"]
