"""Real clusters on 127.0.0.1 for ``python -m ps.bench``: start, drive, measure, kill.

A :class:`Cluster` is a scheduler, S servers and W workers started with ``DMLC_*``
variables, each in its own process group. ps runs ``python -m ps`` for scheduler and
servers; native MXNet runs ``python -c "import mxnet"`` (its import starts the role
named by ``DMLC_ROLE``). Workers run :mod:`ps._bench_worker` and are driven by JSON
lines. Every wait is bounded, and :meth:`Cluster.kill` ends every process by pid.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

PYTHON = sys.executable
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without any DMLC_/PS_/MXNET_KVSTORE setting of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "MXNET_KVSTORE"))}
    env.update(extra or {})
    return env


class Cluster:
    """One job: ``impl`` is "ps", "native", or "ps-b" (ps from another checkout, named by
    ``PYTHONPATH`` in ``env``); ``spec`` goes to every worker driver."""

    def __init__(self, impl: str, workers: int, servers: int, spec: dict[str, Any],
                 env: dict[str, str] | None = None, timeout: float = 120.0, wrap: list[str] | None = None):
        self.impl, self.num_workers, self.num_servers = impl, workers, servers
        self.kind = "native" if impl == "native" else "ps"
        self.spec = {**spec, "impl": self.kind}
        self.timeout = timeout
        self.wrap = wrap or []           # e.g. py-spy record ... -- (ps servers only)
        self.port = free_port()
        self.logdir = tempfile.mkdtemp(prefix=f"ps-bench-{impl}-")
        self.env = base_env({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(self.port),
                             "DMLC_NUM_SERVER": str(servers), "DMLC_NUM_WORKER": str(workers),
                             "DMLC_NODE_HOST": "127.0.0.1", "PS_CONNECT_TIMEOUT": str(int(timeout)),
                             **(env or {})})
        self.scheduler: subprocess.Popen | None = None
        self.servers: list[subprocess.Popen] = []
        self.workers: list[subprocess.Popen] = []
        self._answers: list[queue.Queue] = []
        self._logs: dict[int, str] = {}
        self.ranks: list[int] = []

    # -- processes -------------------------------------------------------------------------
    def _spawn(self, role: str, argv: list[str], index: int, pipes: bool = False) -> subprocess.Popen:
        log = os.path.join(self.logdir, f"{role}{index}.log")
        with open(log, "w") as fh:
            proc = subprocess.Popen(argv, env={**self.env, "DMLC_ROLE": role}, stderr=fh,
                                    stdout=subprocess.PIPE if pipes else fh,
                                    stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
                                    start_new_session=True, text=pipes)
        self._logs[proc.pid] = log
        return proc

    def _role_argv(self) -> list[str]:
        if self.kind == "native":
            return [PYTHON, "-c", "import mxnet"]
        return [PYTHON, "-m", "ps"]

    def start(self) -> None:
        """Start every process; return once each worker initialized all its keys."""
        try:
            self.scheduler = self._spawn("scheduler", self._role_argv(), 0)
            self.servers = [self._spawn("server", self.wrap_argv(i), i) for i in range(self.num_servers)]
            worker_argv = [PYTHON, "-m", "ps._bench_worker", json.dumps(self.spec)]
            for i in range(self.num_workers):
                proc = self._spawn("worker", worker_argv, i, pipes=True)
                q: queue.Queue = queue.Queue()
                threading.Thread(target=_pump, args=(proc.stdout, q), daemon=True,
                                 name=f"bench-read-{proc.pid}").start()
                self.workers.append(proc)
                self._answers.append(q)
            ready = self._collect("start-up (join and init)", self.timeout)
            self.ranks = [r["rank"] for r in ready]
        except BaseException:
            self.kill()
            raise

    def wrap_argv(self, index: int) -> list[str]:
        argv = self._role_argv()
        if self.wrap and self.kind == "ps":
            return [a.replace("{i}", str(index)) for a in self.wrap] + argv
        return argv

    @property
    def pids(self) -> list[int]:
        procs = [self.scheduler, *self.servers, *self.workers]
        return [p.pid for p in procs if p is not None]

    @property
    def server_pids(self) -> list[int]:
        return [p.pid for p in self.servers]

    # -- commands --------------------------------------------------------------------------
    def command(self, cmd: dict[str, Any], timeout: float | None = None, ranks: list[int] | None = None) -> list[dict]:
        """Send ``cmd`` to every worker (or those at ``ranks`` indexes); answers in worker order."""
        idx = range(len(self.workers)) if ranks is None else ranks
        line = json.dumps(cmd) + "\n"
        for i in idx:
            try:
                self.workers[i].stdin.write(line)
                self.workers[i].stdin.flush()
            except (BrokenPipeError, OSError):
                raise BenchError(self._failure(f"{self.impl} worker {i} is gone")) from None
        return self._collect(f"{cmd.get('op')} {cmd.get('case', '')}".strip(), timeout or self.timeout, list(idx))

    def _collect(self, what: str, timeout: float, idx: list[int] | None = None) -> list[dict]:
        deadline = time.monotonic() + timeout
        out = []
        for i in (range(len(self.workers)) if idx is None else idx):
            while True:
                try:
                    ans = self._answers[i].get(timeout=max(0.05, min(0.5, deadline - time.monotonic())))
                    break
                except queue.Empty:
                    dead = [p for p in [self.scheduler, *self.servers, *self.workers] if p.poll() is not None]
                    if dead or time.monotonic() > deadline:
                        why = (f"process {dead[0].args[:3]} exited with {dead[0].returncode}" if dead
                               else f"no answer within {timeout:g}s")
                        raise BenchError(self._failure(f"{self.impl} W{self.num_workers}S{self.num_servers} "
                                                       f"{what}: {why}"))
            if ans is None or not ans.get("ok"):
                err = "worker closed its output" if ans is None else ans.get("error", "?")
                raise BenchError(self._failure(f"{self.impl} worker {i} failed in {what}:\n{err}"))
            out.append(ans)
        return out

    def _failure(self, text: str, tail: int = 30) -> str:
        parts = [text]
        for pid, path in self._logs.items():
            try:
                with open(path) as fh:
                    lines = fh.read().splitlines()[-tail:]
            except OSError:
                continue
            if lines:
                parts.append(f"--- {os.path.basename(path)} (pid {pid}) ---\n" + "\n".join(lines))
        return "\n".join(parts)

    # -- shutdown --------------------------------------------------------------------------
    def stop(self, timeout: float = 20.0) -> None:
        """Ask the workers to quit, wait for every process, kill what is left.
        The logs are deleted when every process exited 0, else kept (their path is printed)."""
        try:
            for proc in self.workers:
                try:
                    proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                    proc.stdin.close()
                except (BrokenPipeError, OSError, ValueError):
                    pass
            deadline = time.monotonic() + timeout
            for proc in [*self.workers, *self.servers, self.scheduler]:
                if proc is not None:
                    try:
                        proc.wait(max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        pass
        finally:
            self.kill()
        procs = [*self.workers, *self.servers, self.scheduler]
        if all(p is not None and p.returncode == 0 for p in procs):
            shutil.rmtree(self.logdir, ignore_errors=True)
        else:
            codes = ", ".join(f"{os.path.basename(self._logs.get(p.pid, '?'))}={p.returncode}" for p in procs if p)
            print(f"ps.bench: {self.impl} processes did not all exit 0 ({codes}); logs in {self.logdir}",
                  file=sys.stderr)

    def kill(self) -> None:
        procs = [p for p in [*self.workers, *self.servers, self.scheduler] if p is not None]
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 3.0
        for proc in procs:
            try:
                proc.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(3.0)
                except subprocess.TimeoutExpired:
                    pass
        for proc in self.workers:
            for stream in (proc.stdin, proc.stdout):
                try:
                    if stream:
                        stream.close()
                except (OSError, ValueError):
                    pass


def _pump(stream: Any, q: queue.Queue) -> None:
    try:
        for line in stream:
            line = line.strip()
            if line.startswith("{"):
                try:
                    q.put(json.loads(line))
                except ValueError:
                    pass
    except (OSError, ValueError):
        pass
    q.put(None)


# -- measuring ---------------------------------------------------------------------------------
def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of ``pid`` in bytes (empty when the process is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    name, value = line.split(":", 1)
                    out[name] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def listen_ports(pid: int) -> set[int]:
    """TCP ports ``pid`` listens on (matched through its socket inodes)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    f = line.split()
                    if f[3] == "0A" and f[9] in inodes:
                        ports.add(int(f[1].rsplit(":", 1)[1], 16))
        except OSError:
            pass
    return ports


def cpu_ticks(pid: int) -> int:
    """utime + stime of every thread of ``pid``, in clock ticks (0 when gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        vals = [int(v) for v in fh.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return total - idle, total


class CpuWindow:
    """CPU use during a window: machine busy %, and busy % not accounted to ``pids`` ("foreign")."""

    def __init__(self, pids: list[int]):
        self.pids = [*pids, os.getpid()]
        self.busy0, self.total0 = machine_ticks()
        self.ours0 = sum(cpu_ticks(p) for p in self.pids)

    def close(self) -> tuple[float, float]:
        busy, total = machine_ticks()
        ours = sum(cpu_ticks(p) for p in self.pids)
        span = max(1, total - self.total0)
        busy_pct = 100.0 * (busy - self.busy0) / span
        foreign = 100.0 * max(0, (busy - self.busy0) - (ours - self.ours0)) / span
        return busy_pct, foreign


class RoleCpu:
    """CPU time each worker and each server of one cluster spends in a window (ms)."""

    def __init__(self, cluster: Any):
        self.roles = {"worker": [p.pid for p in cluster.workers], "server": list(cluster.server_pids)}
        self.start = {pid: cpu_ticks(pid) for pids in self.roles.values() for pid in pids}

    def per_process_ms(self) -> dict[str, float]:
        """Mean over the role's processes of the CPU ms each used since the start."""
        tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK")
        return {role: sum(cpu_ticks(p) - self.start[p] for p in pids) * tick_ms / len(pids)
                for role, pids in self.roles.items() if pids}


def settle(pids: list[int], max_foreign: float, timeout: float, sample: float = 0.25) -> float:
    """Wait (at most ``timeout`` s) until other tenants use < ``max_foreign`` % CPU; return last %."""
    deadline = time.monotonic() + timeout
    while True:
        win = CpuWindow(pids)
        time.sleep(sample)
        _, foreign = win.close()
        if foreign < max_foreign or time.monotonic() >= deadline:
            return foreign
