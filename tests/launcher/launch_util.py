"""Helpers for the launcher tests: the launcher CLI as a subprocess, recipe runner, pid scans.

Every process a test starts is found again by a unique marker variable in its
environment (``--env PS_TEST_JOB:<uuid>`` reaches every role) and killed by pid.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from launcher.process import start_group, stop_group
from tests.helpers import poll_for, processes_with_env

__all__ = ["ROOT", "INFRA", "WORKER", "PY", "source", "bash", "need_root", "poll_for", "marked_pids",
           "Launch", "worker_cmd"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INFRA = os.path.join(ROOT, "tests", "infra")
WORKER = os.path.join(ROOT, "tests", "launcher", "job_worker.py")
PY = sys.executable


def source(script: str, *names: str, env: dict | None = None, timeout: float = 120) -> dict:
    """Run a recipe in bash (daemons it starts outlive bash); return the named variables."""
    cmd = f"source {INFRA}/{script} >/dev/null 2>&1; " + "; ".join(f'echo "${n}"' for n in names)
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=timeout, check=True,
                         env={**os.environ, **(env or {})}).stdout.splitlines()
    return dict(zip(names, out))


def bash(cmd: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=False, timeout=timeout,
                          env={**os.environ, **(env or {})})


def need_root(*tools: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    missing = [t for t in tools if not (shutil.which(t) or os.path.exists(t))]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (see tests/infra/apt-packages.txt)")


def marked_pids(marker: str) -> list[int]:
    """Live processes whose environment holds PS_TEST_JOB=<marker>."""
    return processes_with_env("PS_TEST_JOB", marker)


class Launch:
    """The launcher CLI as a subprocess in its own session, output collected by threads."""

    def __init__(self, args, env=None, cwd=ROOT, prefix=(), marker=None):
        self.marker = marker or uuid.uuid4().hex
        self.argv = [*prefix, PY, "-m", "ps.launch", "--env", f"PS_TEST_JOB:{self.marker}", *args]
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.proc = start_group(self.argv, {**os.environ, **(env or {})}, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._readers = [threading.Thread(target=self._pump, args=(s,), daemon=True)
                         for s in (self.proc.stdout, self.proc.stderr)]
        for t in self._readers:
            t.start()

    def _pump(self, stream) -> None:
        with stream:
            for raw in iter(stream.readline, b""):
                with self._lock:
                    self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    @property
    def output(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def matching(self, prefix: str) -> list[str]:
        with self._lock:
            return [ln for ln in self.lines if ln.startswith(prefix)]

    def ready(self) -> int:
        """How many workers said ``ready`` (PS_TEST_HANG)."""
        with self._lock:
            return sum(1 for ln in self.lines if re.match(r"^\[worker \d+\] rank=\d+ ready pid=", ln))

    def worker_lines(self, rank: int) -> list[str]:
        """What job_worker.py printed as worker ``rank`` (remote login shells may add noise,
        e.g. a ~/.bashrc that runs `pyenv rehash`)."""
        return [ln for ln in self.matching(f"[worker {rank}] ")
                if ln.startswith((f"[worker {rank}] env ", f"[worker {rank}] rank="))]

    def wait_for(self, pred, timeout: float = 30) -> None:
        """Until pred(self) holds; fails early if the launcher exits first."""
        poll_for(lambda: pred(self) or self.proc.poll() is not None, timeout)
        if not pred(self):
            raise AssertionError(f"condition not met within {timeout}s (launcher exit "
                                 f"{self.proc.poll()}); output:\n{self.output}")

    def wait(self, timeout: float = 60) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"launcher still running after {timeout}s; output:\n{self.output}")
        for t in self._readers:
            t.join(5)
        return rc

    def cleanup(self) -> None:
        """Kill the launcher's group and anything carrying this job's marker (by pid)."""
        if self.proc.poll() is None:
            stop_group(self.proc, grace=0, sig=signal.SIGKILL)
        for t in self._readers:
            t.join(5)
        for pid in marked_pids(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def worker_cmd(*extra: str) -> list[str]:
    return [PY, WORKER, *extra]
