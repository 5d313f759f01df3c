"""Helpers every test directory shares: the checkout, process starting and stopping (by
process group, through launcher.process), bounded waits, and finding a job's processes."""
from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import time
import weakref
from pathlib import Path

import psutil
import pytest

from launcher.process import start_group, stop_group
from ps.netutil import free_port

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# bytes read_until took from a process's stdout past the line it matched: the next
# read_until, or Procs.finish, starts with them
_UNREAD: weakref.WeakKeyDictionary[subprocess.Popen, bytes] = weakref.WeakKeyDictionary()

__all__ = ["ROOT", "PYTHON", "free_port", "cluster_env", "Procs", "poll_for", "wait_for", "read_until",
           "alive", "processes_with_env", "once_per_session", "Clock"]


class Clock:
    """The time.monotonic a test sets (``clock.now = ...``), for the parts that take a clock."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def cluster_env(port: int, servers: int = 2, workers: int = 2, **extra: str) -> dict[str, str]:
    """Environment for one process of a loopback job (PYTHONPATH points at this checkout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "MXNET_KVSTORE"))}
    env.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_SERVER=str(servers),
               DMLC_NUM_WORKER=str(workers), PYTHONPATH=str(ROOT), PS_CONNECT_TIMEOUT="30",
               PS_HEARTBEAT_INTERVAL="0.5", PS_HEARTBEAT_TIMEOUT="10")
    env.update(extra)
    return env


def once_per_session(tmp_path_factory, name: str, make) -> Path:
    """The directory ``make(directory)`` filled, made once per test session however many xdist
    workers ask: a reference job (nobody killed) that tests on every worker compare with is
    run once, not once per worker that has one of those tests. The first to ask makes it
    under a file lock; the others wait on the lock and find it made. A ``make`` that failed
    leaves nothing behind, so the next to ask tries again (and fails the same way)."""
    from filelock import FileLock
    base = tmp_path_factory.getbasetemp()
    # an xdist worker's is <the session's>/popen-gwN; without xdist, the session's own (not its
    # parent, which every session on the machine shares). Not PYTEST_XDIST_WORKER: a pytest a
    # test starts inherits it
    root = base.parent if base.name.startswith("popen-gw") else base
    where, done = root / f"once-{name}", root / f"once-{name}.done"
    with FileLock(str(root / f"once-{name}.lock"), timeout=600):
        if not done.exists():
            if where.exists():
                shutil.rmtree(where)
            where.mkdir()
            try:
                make(where)
            except BaseException:
                shutil.rmtree(where, ignore_errors=True)
                raise
            done.touch()
    return where


class Procs:
    """Starts processes in their own process groups and kills whatever is left, by group."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
        kw.setdefault("cwd", str(ROOT))
        kw.setdefault("stderr", subprocess.PIPE)        # subprocess.STDOUT: read both with read_until
        proc = start_group(args, env, stdout=subprocess.PIPE, text=True, **kw)
        self.procs.append(proc)
        return proc

    def role(self, role: str, env: dict[str, str], script: str | None = None, *args: str) -> subprocess.Popen:
        env = {**env, "DMLC_ROLE": role}
        cmd = [PYTHON, "-m", "ps"] if script is None else [PYTHON, script, *args]
        return self.start(cmd, env)

    def finish(self, proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str, str]:
        """Wait for ``proc``; return (exit code, stdout, stderr)."""
        unread = _UNREAD.pop(proc, b"").decode(errors="replace")
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(proc)
            out, err = proc.communicate()
            pytest.fail(f"process {proc.args} did not exit within {timeout}s\nstdout:{unread}{out}\nstderr:{err}")
        return proc.returncode, unread + out, err or ""

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        """SIGTERM, then SIGKILL after 3 s: a launcher gets the time to stop its own job (its
        processes run in their own sessions, out of reach of a kill of its group)."""
        if proc.poll() is None:
            stop_group(proc, grace=3.0)

    def cleanup(self) -> None:
        for proc in self.procs:
            self.kill(proc)
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()


def poll_for(pred, timeout: float, interval: float = 0.05):
    """``pred()``'s first true value within ``timeout`` s, else its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    return pred()


def wait_for(pred, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    """Like :func:`poll_for`, but a timeout fails the test naming ``what``."""
    value = poll_for(pred, timeout, interval)
    if not value:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")
    return value


def read_until(proc: subprocess.Popen, pred, timeout: float, what: str) -> str:
    """Read ``proc``'s stdout line by line until ``pred(line)``, never blocking past the
    deadline (``readline`` would). Reads the raw fd; what it read past the matching line is
    kept for the next call and for :meth:`Procs.finish`."""
    fd, buf, end = proc.stdout.fileno(), _UNREAD.pop(proc, b""), time.monotonic() + timeout
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            text = line.decode(errors="replace")
            if pred(text):
                _UNREAD[proc] = buf
                return text
        left = end - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        if select.select([fd], [], [], min(left, 0.5))[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"the process ended before {what}")
            buf += chunk


def alive(pid: int) -> bool:
    """Running, and not a zombie that only waits to be reaped."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def processes_with_env(name: str, value: str) -> list[int]:
    """pids of live processes (not this one) whose environment has ``name=value``: how a test
    finds every process of a job it started, wherever in the process tree they ended up."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        if proc.info["pid"] == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if proc.environ().get(name) == value:
                found.append(proc.info["pid"])
        except psutil.Error:
            continue
    return found


def table_push(spec, seq, ids, grads, off=0, total=None, ts=1):
    """An embedding table's push entry and rows, as a worker sends them (ps/worker.py)."""
    import numpy as np
    from ps.frames import Rows
    from ps.message import Entry, Op
    ids = np.asarray(ids, np.int64)
    total = len(ids) if total is None else total
    entry = Entry(ts, Op.PUSH | Op.TABLE, spec.key, off, len(ids), total, 0, None, spec.dim, seq)
    return entry, Rows(ids, np.asarray(grads, np.float32).reshape(-1))


def table_pull(spec, ids, seq=0, ts=9):
    """An embedding table's pull entry and ids; ``seq``: the puller's pushes so far."""
    import numpy as np
    from ps.frames import Rows
    from ps.message import Entry, Op
    ids = np.asarray(ids, np.int64)
    return Entry(ts, Op.PULL | Op.TABLE, spec.key, 0, len(ids), len(ids), 0, None, spec.dim, seq), Rows(ids)
