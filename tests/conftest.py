"""Fixtures every test gets: processes killed by group at teardown, a check that a test
leaves no thread or process of its own behind, and the fast tier kept pure: a test without
the ``process`` marker that starts a process or opens a socket fails, naming what it did.
Helpers live in tests/helpers.py."""
from __future__ import annotations

import os
import socket
import subprocess
import threading

import psutil
import pytest
import zmq

from tests.helpers import Procs, free_port, poll_for

# seconds a test's threads and processes get to end after it (tests/integration/test_conftest.py
# runs its leaky tests with less: what it checks is the failure, not the wait)
LEAK_GRACE = float(os.environ.get("TESTS_LEAK_GRACE", "5.0"))

# One OpenMP and one OpenBLAS thread in every process a test starts (they inherit this
# environment): the models here are tiny, a job's five processes share two cores, and
# OpenBLAS alone spends ~70 ms of CPU starting a thread per core in each of the suite's
# ~1,400 processes (numpy, MXNet and torch each load one). A test that wants more sets its own.
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

OUR_THREADS = ("ps-", "bench-read")   # names of the threads ps and its tests start


@pytest.fixture(scope="session", autouse=True)
def _open_mpi_worker_dir(tmp_path_factory):
    """Open MPI 4 keeps one session directory per user and host (/tmp/ompi.HOST.UID) and removes
    it when it is empty: an mpirun that ends while another starts can remove it between the
    other's mkdir and stat, and that one fails in orte_init ("mkdir ... File exists",
    open-mpi/ompi#8510). So each xdist worker has a directory of its own (in pytest's temporary
    directory, which pytest prunes), which every process its tests start inherits, and each test
    one more (_open_mpi_test_dir): an earlier test's mpirun may still be cleaning up, e.g. one
    that ends on the SIGTERM of a launcher the test killed. One the user set is kept.
    Returns the user's value, if any."""
    user = os.environ.get("OMPI_MCA_orte_tmpdir_base")
    if user is None:
        os.environ["OMPI_MCA_orte_tmpdir_base"] = str(tmp_path_factory.mktemp("ompi"))
    return user


@pytest.fixture(autouse=True)
def _open_mpi_test_dir(_open_mpi_worker_dir, tmp_path_factory, monkeypatch):
    if _open_mpi_worker_dir is None:
        monkeypatch.setenv("OMPI_MCA_orte_tmpdir_base", str(tmp_path_factory.mktemp("ompi")))


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


def _refuse(nodeid: str, what: str):
    def refused(*args, **kwargs):
        raise AssertionError(f"{nodeid} {what}, but it is in the fast tier: mark it, or its module, "
                             "with `pytest.mark.process` (tests/conftest.py)")
    return refused


# what a fast-tier test may not call: the ways a process starts or a socket reaches out
_OUTSIDE = [(subprocess.Popen, "_execute_child", "starts a process"), (os, "fork", "forks"),
            (os, "posix_spawn", "starts a process"), (os, "posix_spawnp", "starts a process"),
            (socket.socket, "bind", "binds a socket"), (socket.socket, "connect", "connects a socket"),
            (socket.socket, "connect_ex", "connects a socket"), (zmq.Socket, "bind", "binds a zmq socket"),
            (zmq.Socket, "connect", "connects a zmq socket")]


def _in_process_tier(item: pytest.Item) -> bool:
    return item.get_closest_marker("process") is not None


def pytest_collection_modifyitems(session, config, items):
    """The fast tier runs first, so its failures show within a minute of a whole run; the
    files' own order inside each tier."""
    items.sort(key=_in_process_tier)


# Test files that use what only one test at a time can have: Slurm's and gridengine's fixed
# ports, the namespace hosts' names and addresses (tests/infra/netns_up.sh, ps.bench --hosts),
# the sshd fixture's hosts. Under xdist (tests/run.sh runs three workers) they run one after
# another on one worker, started first (their waits overlap the other workers' CPU-bound
# tests); every other test is its own unit of work.
ONE_AT_A_TIME = ("tests/launcher/test_launcher_batch.py", "tests/launcher/test_launcher_mpi.py",
                 "tests/launcher/test_launcher_multihost.py", "tests/launcher/test_launcher_ssh.py",
                 "tests/launcher/test_chaos.py", "tests/bench/test_bench_smoke.py",
                 "tests/launcher/test_kubernetes_e2e.py")      # its scheduler pods bind port 9091


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's load scheduling, with the files of ONE_AT_A_TIME as one unit of work, that
    survives a crashed worker (tests/xdist_scheduling.py)."""
    from tests.xdist_scheduling import make
    return make(config, log, ONE_AT_A_TIME)


@pytest.fixture(autouse=True)
def fast_tier_is_pure(request, monkeypatch):
    """``pytest -m "not process"`` is the fast tier: no processes, no sockets, so it runs in
    a couple of minutes and a failure there points at code, not at a machine's timing."""
    if request.node.get_closest_marker("process") is None:
        for owner, name, what in _OUTSIDE:
            monkeypatch.setattr(owner, name, _refuse(request.node.nodeid, what))
    yield


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
