"""Real clusters on 127.0.0.1 for ``python -m ps.bench``: start, drive, measure, kill.

A :class:`Cluster` is a scheduler, S servers and W workers started with ``DMLC_*``
variables, each in its own process group. ps runs ``python -m ps`` for scheduler and
servers; native MXNet runs ``python -c "import mxnet"`` (its import starts the role
named by ``DMLC_ROLE``). Workers run :mod:`ps.bench.worker` and are driven by JSON
lines. Every wait is bounded, and :meth:`Cluster.kill` ends every process by pid.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from launcher.process import killpg, start_group, stop_group
from ps.netutil import free_port

PYTHON = sys.executable


class BenchError(RuntimeError):
    pass


ROOT = str(Path(__file__).resolve().parents[2])     # the checkout (or site-packages) this ps runs from


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without any DMLC_/PS_/MXNET_KVSTORE setting of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "MXNET_KVSTORE"))}
    env.update(extra or {})
    return env


class Cluster:
    """One job: ``impl`` is "ps", "native", or "ps-b" (ps from another checkout, named by
    ``PYTHONPATH`` in ``env``); ``spec`` goes to every worker driver. ``joint``: no server
    processes, each worker holds a server shard (DMLC_ROLE=joint; ``servers`` is ignored)."""

    def __init__(self, impl: str, workers: int, servers: int, spec: dict[str, Any],
                 env: dict[str, str] | None = None, timeout: float = 120.0, wrap: list[str] | None = None,
                 joint: bool = False):
        self.joint = joint
        servers = workers if joint else servers
        self.impl, self.num_workers, self.num_servers = impl, workers, servers
        self.kind = "native" if impl == "native" else "ps"
        self.spec = {**spec, "impl": self.kind}
        self.timeout = timeout
        self.wrap = wrap or []           # e.g. py-spy record ... -- (ps servers only)
        self.port = free_port()
        self.logdir = tempfile.mkdtemp(prefix=f"ps-bench-{impl}-")
        here = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))   # this ps (ps-b: its own)
        self.env = base_env({"PYTHONPATH": here, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(self.port),
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
            # run in the job's own directory: ``python -m`` puts the working directory first on
            # sys.path, and run from a checkout it would import that checkout's ps on both
            # sides of an --ab comparison
            proc = start_group(argv, {**self.env, "DMLC_ROLE": role}, stderr=fh, cwd=self.logdir,
                               stdout=subprocess.PIPE if pipes else fh,
                               stdin=subprocess.PIPE if pipes else subprocess.DEVNULL, text=pipes)
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
            if not self.joint:
                self.servers = [self._spawn("server", self.wrap_argv(i), i) for i in range(self.num_servers)]
            worker_argv = [PYTHON, "-m", self._worker_module(), json.dumps(self.spec)]
            for i in range(self.num_workers):
                proc = self._spawn("joint" if self.joint else "worker", worker_argv, i, pipes=True)
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

    def _worker_module(self) -> str:
        """The driver module of the checkout this cluster runs (``--ab`` may name one from
        before ps.bench became a package)."""
        tree = self.env.get("PYTHONPATH", "").split(os.pathsep)[0]
        if tree and os.path.exists(os.path.join(tree, "ps", "_bench_worker.py")):
            return "ps._bench_worker"
        return "ps.bench.worker"

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
        """SIGTERM to every process group, 3 s, then SIGKILL (launcher.process.stop_group)."""
        procs = [p for p in [*self.workers, *self.servers, self.scheduler] if p is not None]
        for proc in procs:
            if proc.poll() is None:
                killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            stop_group(proc, grace=3.0)
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


def worker_results(what: str, workers: list[Any], outs: list[tuple[str, str]], logs: list[Any]) -> list[dict]:
    """The ``RESULT {json}`` line each finished worker printed (``python -m ps.bench.torch``,
    ``ps.bench.embedding``); a worker that failed or printed none raises with its log's end."""
    found = []
    for w, (out, _), log in zip(workers, outs, logs):
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if w.returncode != 0 or not lines:
            log.seek(0)
            raise RuntimeError(f"{what} worker failed (exit {w.returncode}):\n{log.read()[-3000:]}")
        found.append(json.loads(lines[0][len("RESULT "):]))
    return found


def torch_job(what: str, argv: list[str], env: dict[str, str], worker_envs: list[dict[str, str]],
              servers: int = 0, timeout: float = 1800.0, hosts: Any = None) -> tuple[list[dict], list[int]]:
    """Run one worker process per ``worker_envs`` entry (``argv`` with ``env`` and that entry)
    and, with ``servers``, a ps scheduler and that many servers for them (``env`` names the
    scheduler); wait for every worker's ``RESULT`` line. Returns the results and each
    server's peak RSS (``python -m ps.bench.embedding``, ``ps.bench.capacity``).

    ``hosts`` (ps/bench/netns.py's ``Hosts``): the scheduler on host 0, worker r on host
    1 + r, server i on host 1 + i, round robin over the K hosts."""
    from .measure import PeakRss

    def place(host: int, cmd: list[str], extra: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        if hosts is None:
            return cmd, {**env, **extra}
        host = 0 if host == 0 else 1 + (host - 1) % hosts.count
        return hosts.argv(host, cmd), {**env, **extra, "DMLC_NODE_HOST": hosts.ip(host)}
    node = [sys.executable, "-m", "ps"]
    procs = []
    if servers:
        procs = [start_group(*place(0, node, {"DMLC_ROLE": "scheduler"}))]
        procs += [start_group(*place(1 + i, node, {"DMLC_ROLE": "server"})) for i in range(servers)]
    logs = [tempfile.TemporaryFile("w+") for _ in worker_envs]
    workers = [start_group(*place(1 + r, argv, extra), stdout=-1, stderr=log, text=True)
               for r, (extra, log) in enumerate(zip(worker_envs, logs))]
    watch = PeakRss([p.pid for p in procs[1:]])
    watch.start()
    try:
        outs = [w.communicate(timeout=timeout) for w in workers]
    finally:
        watch.done.set()
        for p in workers + procs:
            stop_group(p, grace=10)
    return worker_results(what, workers, outs, logs), watch.peaks
